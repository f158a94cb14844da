"""Short functions where the operator decides and acts: the per-step function reads as collect -> step ->
scale in at most 40 lines, and no function in `controller/` or `scaling/` is over 80 (issue 16).

Lengths are read with `ast`: from the `def` line to the function's last line, decorators left out,
docstring and comments counted (a long docstring is a long function to read too).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PREHEAT = Path(__file__).resolve().parents[2] / "operator" / "preheat"
MAX_LINES = 80
STEP_MAX_LINES = 40


def _functions(package: str) -> dict[str, int]:
    """'path/in/preheat.py:qualified.name' -> its length in lines, for every function in the package."""
    out = {}
    for path in sorted((PREHEAT / package).rglob("*.py")):
        rel = path.relative_to(PREHEAT).as_posix()

        def walk(node: ast.AST, prefix: str, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{rel}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                    walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
                else:
                    walk(child, prefix)

        walk(ast.parse(path.read_text(), filename=str(path)), "")
    return out


@pytest.mark.parametrize("package", ["controller", "scaling"])
def test_no_function_over_80_lines(package):
    functions = _functions(package)
    assert len(functions) > 20, functions  # the walk found the package's functions
    long = {name: n for name, n in functions.items() if n > MAX_LINES}
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_the_operator_step_is_collect_step_scale_in_at_most_40_lines():
    functions = _functions("controller")
    step = functions["controller/loop.py:Controller.step"]
    assert step <= STEP_MAX_LINES, step
    tree = ast.parse((PREHEAT / "controller" / "loop.py").read_text())
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "step")
    calls = [n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    called = [n.func.id for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]
    order = [called.index(name) for name in ("collect", "step", "scale")]
    assert order == sorted(order), f"the step collects, then decides, then scales: {called}"


def test_the_length_reader_counts_a_long_function(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("class C:\n    def f(self):\n" + "        x = 1\n" * 90 + "\n\ndef g():\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "PREHEAT", tmp_path)
    assert _functions("pkg") == {"pkg/m.py:C.f": 91, "pkg/m.py:g": 2}
