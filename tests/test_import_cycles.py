"""No import circles in ``tokenpos`` (issue 27): the module import graph, read statically, is acyclic.

Every ``.py`` file under ``src/tokenpos`` is parsed with ``ast`` (nothing is imported). An edge A -> B
is any import of ``tokenpos`` module B by module A:

- ``import tokenpos.x.y`` and ``from tokenpos.x.y import name`` -> ``tokenpos.x.y`` (a package means its
  ``__init__.py``); ``from tokenpos.x import y`` -> ``tokenpos.x.y`` when ``y`` is a submodule, else
  ``tokenpos.x``; relative imports (``from . import y``, ``from ..x import name``) resolved the same way;
  ``importlib.import_module("tokenpos.x")`` with a literal name counts too.
- imports anywhere count: module level, inside functions and methods, in ``try`` / ``if`` blocks. An
  import deferred into a function still makes a circle: it only moves the failure to the first call.
- imports under ``if TYPE_CHECKING:`` do not count (never executed); its ``else:`` branch does.
- the implicit import of the parent packages (``tokenpos.x`` before ``tokenpos.x.y``) is not an edge:
  every package that imports its own submodules would otherwise be a circle. A module importing
  itself is not one either.

A failure lists each circle as the chain of import lines that closes it (file:line and the statement).
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by ``source``, where it is written."""

    source: str
    target: str
    path: Path
    line: int
    statement: str


def module_names(src: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``package`` (a folder under ``src``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``<module>.TYPE_CHECKING`` (``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom | ast.Call]:
    """Every import statement and ``import_module("...")`` call, at any depth, except under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom | ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:                  # only the else branch ever runs
                visit(stmt)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` names: itself, else its longest known prefix (``pkg.attr`` -> ``pkg``); None outside."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _base_of(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from X import ...`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def import_edges(src: Path, package: str) -> list[Edge]:
    """Every import of a module of ``package`` by a module of ``package`` (module docstring for the rules)."""
    modules = module_names(src, package)
    edges = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str | None]
            if isinstance(node, ast.Import):
                targets = [_resolve(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base_of(node, module, is_package)
                # ``from pkg import sub``: the submodule sub when there is one, else the name lives in pkg
                targets = [_resolve(base if alias.name == "*" else f"{base}.{alias.name}".lstrip("."), modules)
                           for alias in node.names]
            else:
                name = node.args[0]
                assert isinstance(name, ast.Constant) and isinstance(name.value, str)  # literal names only
                targets = [_resolve(name.value, modules)]
            for target in dict.fromkeys(targets):
                if target is not None and target != module:
                    edges.append(Edge(module, target, path, node.lineno, ast.unparse(node)))
    return edges


@dataclass(frozen=True)
class Cycle:
    """A strongly connected group of modules and one shortest circle through its first module."""

    modules: list[str]
    edges: list[Edge]


def find_cycles(edges: list[Edge]) -> list[Cycle]:
    """One per strongly connected group of modules (Tarjan): its modules, and the edges of one shortest circle."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)       # first import of target by source
        graph.setdefault(e.target, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strongconnect(v: str) -> None:                                 # recursion depth <= number of modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    cycles = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        parent: dict[str, Edge] = {}
        queue = deque([start])
        while queue:                                                   # BFS back to start inside the group
            v = queue.popleft()
            for w, e in sorted(graph[v].items()):
                if w in members and w not in parent:
                    parent[w] = e
                    queue.append(w)
        chain, v = [], start
        while True:
            chain.append(parent[v])
            v = parent[v].source
            if v == start:
                break
        cycles.append(Cycle(group, chain[::-1]))
    return cycles


def describe(cycles: list[Cycle], root: Path) -> str:
    """Each circle as ``a -> b -> a`` and the import lines that close it; the other modules of its group."""
    lines = []
    for cycle in cycles:
        chain = cycle.edges
        lines.append(" -> ".join([chain[0].source] + [e.target for e in chain]))
        for e in chain:
            lines.append(f"    {e.path.relative_to(root)}:{e.line}: {e.statement}")
        others = sorted(set(cycle.modules) - {e.source for e in chain})
        if others:
            lines.append(f"    (the same circle also runs through {', '.join(others)})")
    return "\n".join(lines)


def test_tokenpos_has_no_import_cycles() -> None:
    edges = import_edges(SRC, "tokenpos")
    assert len({e.source for e in edges}) > 20                            # the walk really read the package
    cycles = find_cycles(edges)
    if cycles:
        print(describe(cycles, SRC))
    assert not cycles, f"{len(cycles)} import circle(s) in tokenpos:\n{describe(cycles, SRC)}"


# ---------------------------------------------------------------------------------------------- the checker itself


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_known_cycle_is_found(tmp_path: Path) -> None:
    src = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import helper\n",
        "pkg/b.py": "def helper():\n    from pkg import a\n    return a\n",           # deferred: still a circle
        "pkg/c.py": "import pkg.a\n",                                               # into the circle, not on it
    })
    cycles = find_cycles(import_edges(src, "pkg"))
    assert len(cycles) == 1
    assert cycles[0].modules == ["pkg.a", "pkg.b"]
    chain = cycles[0].edges
    assert [(e.source, e.target) for e in chain] == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.a")]
    assert [(e.path.name, e.line, e.statement) for e in chain] == [
        ("a.py", 1, "from .b import helper"), ("b.py", 2, "from pkg import a")]
    text = describe(cycles, src)
    assert "pkg.a -> pkg.b -> pkg.a" in text and "pkg/b.py:2: from pkg import a" in text


def test_a_longer_cycle_through_packages_is_found(tmp_path: Path) -> None:
    src = write_package(tmp_path, {
        "pkg/__init__.py": "from pkg.sub.x import X\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "import importlib\nX = 1\ndef f():\n    return importlib.import_module('pkg.y')\n",
        "pkg/y.py": "from pkg import X\n",                          # a name of pkg: edge to pkg/__init__.py
    })
    (cycle,) = find_cycles(import_edges(src, "pkg"))
    chain = cycle.edges
    assert [e.source for e in chain] == ["pkg", "pkg.sub.x", "pkg.y"]
    assert chain[-1].target == "pkg"


def test_type_checking_imports_and_parent_packages_are_not_edges(tmp_path: Path) -> None:
    src = write_package(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": ("from typing import TYPE_CHECKING\nimport typing\nA = 1\n"
                     "if TYPE_CHECKING:\n    from pkg.b import B\nif typing.TYPE_CHECKING:\n    import pkg.b\n"
                     "else:\n    import os\n"),
        "pkg/b.py": "from pkg.a import A\nfrom . import a as again\nimport pkg.a\n",
    })
    edges = import_edges(src, "pkg")
    assert sorted({(e.source, e.target) for e in edges}) == [("pkg", "pkg.a"), ("pkg.b", "pkg.a")]
    assert find_cycles(edges) == []


@pytest.mark.parametrize("statement, expected", [
    ("from . import b", "pkg.sub.b"),
    ("from .b import name", "pkg.sub.b"),
    ("from . import name", "pkg.sub"),
    ("from .. import other", "pkg.other"),
    ("from ..other import name", "pkg.other"),
    ("from pkg.sub import b, name", "pkg.sub.b pkg.sub"),
    ("import pkg.sub.b as bb", "pkg.sub.b"),
    ("import pkg.sub", "pkg.sub"),
    ("from pkg.sub.b import *", "pkg.sub.b"),
])
def test_imports_resolve_to_modules(tmp_path: Path, statement: str, expected: str) -> None:
    src = write_package(tmp_path, {
        "pkg/__init__.py": "", "pkg/other.py": "", "pkg/sub/__init__.py": "", "pkg/sub/b.py": "",
        "pkg/sub/a.py": f"def f():\n    {statement}\n",
    })
    assert [e.target for e in import_edges(src, "pkg") if e.source == "pkg.sub.a"] == expected.split()


def test_every_module_of_a_circle_is_named(tmp_path: Path) -> None:
    src = write_package(tmp_path, {
        "pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "import pkg.a\nimport pkg.c\n",
        "pkg/c.py": "import pkg.b\n",
    })
    (cycle,) = find_cycles(import_edges(src, "pkg"))
    assert cycle.modules == ["pkg.a", "pkg.b", "pkg.c"]
    assert describe([cycle], src).splitlines()[-1] == "    (the same circle also runs through pkg.c)"
