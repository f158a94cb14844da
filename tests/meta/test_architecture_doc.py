"""docs/ARCHITECTURE.md tells the tree as it is: every package and controller module in its tables,
and every dotted name it cites (the walk of one observation) exists in the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
# Where packages live, and how the doc may name one: by repo path, or (the model server's table) by
# its path under the top package.
ROOTS = (ROOT / "operator" / "preheat", ROOT / "model-server" / "preheat_server", ROOT / "lab")
CITED = re.compile(r"`((?:preheat|preheat_server|preheat_cluster|preheat_lab)(?:\.[A-Za-z_]\w*)+)`")


def _packages() -> list[tuple[Path, Path]]:
    return [(top, init.parent) for top in ROOTS for init in top.rglob("__init__.py")
            if "__pycache__" not in init.parts and init.parent != top]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_package_is_in_the_table():
    packages = _packages()
    assert len(packages) >= 12
    missing = []
    for top, pkg in packages:
        full = f"`{pkg.relative_to(ROOT).as_posix()}/`"
        short = f"`{pkg.relative_to(top).as_posix()}/`"
        if full not in DOC and short not in DOC:
            missing.append(full)
    assert not missing, f"packages missing from docs/ARCHITECTURE.md's tables: {missing}"


def test_every_controller_module_is_in_the_table():
    modules = sorted(p.name for p in (ROOT / "operator" / "preheat" / "controller").glob("*.py")
                     if p.name != "__init__.py")
    assert "handlers.py" in modules
    missing = [m for m in modules if f"| `{m}` |" not in DOC]
    assert not missing, f"controller modules missing from docs/ARCHITECTURE.md: {missing}"


def test_every_cited_name_exists():
    cited = sorted(set(CITED.findall(DOC)))
    assert "preheat.controller.loop.Controller.step" in cited
    stale = [name for name in cited if not _resolves(name)]
    assert not stale, f"docs/ARCHITECTURE.md cites names the code no longer has: {stale}"


def test_the_resolver_rejects_a_name_that_does_not_exist():
    assert _resolves("preheat.controller.actuation.plan")
    assert not _resolves("preheat.controller.actuation.apply_plan")
    assert not _resolves("preheat.no_such_module.thing")
