"""No import cycle in the product packages (`preheat`, `preheat_server`), and no import of the lab.

The graph is read with `ast`, not by importing: every `import`/`from ... import` anywhere in a module
(module level and inside functions, so an import moved into a function to hide a cycle still counts),
relative imports resolved against the module's package. Imports under `if TYPE_CHECKING:` never run
and are left out. `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"preheat": ROOT / "operator" / "preheat", "preheat_server": ROOT / "model-server" / "preheat_server"}


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package)."""
    out = {}
    for top, root in PRODUCT.items():
        for path in root.rglob("*.py"):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            out[".".join(parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Import nodes anywhere in the tree, skipping `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_pkg else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph() -> dict[str, set[str]]:
    files = _module_files()
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, (path, is_pkg) in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in _imports(tree):
            edges |= _targets(node, module, is_pkg, known)
        graph[module] = edges - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_module_and_function_level_and_relative_imports():
    graph = import_graph()
    assert len(graph) > 50
    # module level, relative: the operator's handlers import the spec.
    assert "preheat.controller.spec" in graph["preheat.controller.handlers"]
    # the server's modules resolve too.
    assert any(m.startswith("preheat_server.") for m in graph["preheat_server.server"])


def test_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    graph = {}
    files = {"pkg": (pkg / "__init__.py", True), **{f"pkg.{n}": (pkg / f"{n}.py", False) for n in "abc"}}
    for module, (path, is_pkg) in files.items():
        edges = set()
        for node in _imports(ast.parse(path.read_text())):
            edges |= _targets(node, module, is_pkg, set(files))
        graph[module] = edges - {module}
    assert graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_no_import_cycle_in_the_product_packages():
    found = cycles(import_graph())
    assert not found, "import cycles (each an SCC):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_product_never_imports_the_lab():
    lab = ("preheat_cluster", "preheat_lab")
    offenders = []
    for module, (path, _) in _module_files().items():
        for node in _imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            offenders += [f"{module} imports {n}" for n in names if n.split(".")[0] in lab and not node.level]
    assert not offenders, offenders
