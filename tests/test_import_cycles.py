"""No import circles in ``tokenpos`` (issue 27): the module import graph, read statically, is acyclic.

Every ``.py`` file under ``src/tokenpos`` is parsed with ``ast`` (nothing is imported); the edges and
their rules are ``tests/import_graph.py``'s. In short: imports anywhere count, module level or inside
functions (an import deferred into a function still makes a circle: it only moves the failure to the
first call); imports under ``if TYPE_CHECKING:`` and the implicit import of parent packages do not.

A failure lists each circle as the chain of import lines that closes it (file:line and the statement).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.import_graph import SRC, Edge, import_edges, write_package


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
