"""Imports in ``tokenpos`` go one way (issue 47): every import goes down the layer table below, or stays in its unit.

docs/DESIGN.md states the direction ("Imports go one way: ..."): ``tables`` <- ``kernels`` <- ``numpy`` /
``torch`` <- ``analysis`` <- ``cli``, and inside ``tables`` the formulas and the HF readers use the checks, never
the other way. ``LAYERS`` is that statement as a table, bottom first; each layer holds one or more units, each unit
one or more module entries:

- a module may import any module of its own unit (circles are ``tests/test_import_cycles.py``'s business) and any
  module of a lower layer, nothing else: not a higher layer, and not another unit of its own layer (``numpy`` and
  ``torch`` never import each other).
- an entry covers its module and everything under it, except what a longer entry covers. A package whose parts
  sit on different layers (``tokenpos``, ``tokenpos.tables``) stands for its ``__init__.py`` only; a module no
  entry covers fails the test, so a new top-level or ``tables`` module gets a place on purpose.
- the edges are ``tests/import_graph.py``'s (read with ``ast``, nothing imported): imports inside functions
  count (a deferred import still runs, at the first call); imports under ``if TYPE_CHECKING:`` do not.

Where the parts the one-line statement leaves out sit, as the code stands:

- ``base``, the bottom: the root package ``tokenpos/__init__.py`` (every import of ``tokenpos.x`` runs it first,
  so it may import nothing above; it re-exports ``_config``), ``_config`` (the process-wide switches, read by
  kernels and both backends), ``_outputs`` (the output cache, held by ``_config``), ``_files`` (the atomic
  writer of torch checkpoints and of the CLI / analysis outputs) and ``_hugepages`` (torch's table allocation).
  They import only each other, so they sit under ``tables``, which uses none of them today.
- inside ``tables``, the order of ``tokenpos/tables/__init__.py``'s docstring (``hf`` -> ``formulas`` ->
  ``checks`` -> ``errors``, ``checks.embedding`` also reads ``registry``): ``errors`` and ``plan`` (which
  imports nothing of tokenpos) at its bottom; ``registry`` (imports ``errors``); ``checks``; ``formulas``
  beside ``checkpoint`` (the safetensors IO, which uses ``checks.validation``); ``hf`` (reads HF configs with
  ``formulas``' help, so a formula never reads an HF config); the ``tables`` package itself on top of them, as it
  re-exports ``formulas`` and ``hf``.
- ``kernels`` above all of ``tables`` (it uses ``checks``, ``errors`` and ``formulas``, e.g. the dropout
  hash constants), below both backends; it imports neither.
- ``examples`` beside ``analysis``: a runnable example uses only the public backends (today ``tokenpos.torch``),
  never ``analysis`` or ``cli``, and ``analysis`` does not import it.

A failure names each offending import: file:line, the statement, and the two units and layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.import_graph import SRC, Edge, import_edges, module_names, write_package

#: Bottom first: each layer is ``{unit: module entries}``; see the module docstring for the rules and the places.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"base": ("tokenpos", "tokenpos._config", "tokenpos._outputs", "tokenpos._files", "tokenpos._hugepages")},
    {"tables.errors": ("tokenpos.tables.errors",), "tables.plan": ("tokenpos.tables.plan",)},
    {"tables.registry": ("tokenpos.tables.registry",)},
    {"tables.checks": ("tokenpos.tables.checks",)},
    {"tables.formulas": ("tokenpos.tables.formulas",), "tables.checkpoint": ("tokenpos.tables.checkpoint",)},
    {"tables.hf": ("tokenpos.tables.hf",)},
    {"tables": ("tokenpos.tables",)},
    {"kernels": ("tokenpos.kernels",)},
    {"numpy": ("tokenpos.numpy",), "torch": ("tokenpos.torch",)},
    {"analysis": ("tokenpos.analysis",), "examples": ("tokenpos.examples",)},
    {"cli": ("tokenpos.cli",)},
)


@dataclass(frozen=True)
class Place:
    """Where a module sits: its layer (0 is the bottom) and its unit."""

    layer: int
    unit: str


def place(module: str, layers: tuple[dict[str, tuple[str, ...]], ...]) -> Place | None:
    """The longest entry covering ``module``; None when none does (or only a split package's ``__init__`` would)."""
    entries = {entry: Place(i, unit) for i, units in enumerate(layers)
               for unit, names in units.items() for entry in names}
    covering = [e for e in entries if module == e or module.startswith(e + ".")]
    if not covering:
        return None
    entry = max(covering, key=len)
    if entry != module and any(other.startswith(entry + ".") for other in entries):
        return None                                     # a package split over layers stands for its __init__ only
    return entries[entry]


def wrong_way(edges: list[Edge], layers: tuple[dict[str, tuple[str, ...]], ...]) -> list[tuple[Edge, Place, Place]]:
    """Every import of a placed module that is neither inside its unit nor down to a lower layer."""
    bad = []
    for e in edges:
        source, target = place(e.source, layers), place(e.target, layers)
        if source is None or target is None or source.unit == target.unit or target.layer < source.layer:
            continue
        bad.append((e, source, target))
    return bad


def describe(bad: list[tuple[Edge, Place, Place]], root: Path) -> str:
    """One line per import: where it is written, and which unit it takes upward or sideways."""
    lines = []
    for e, source, target in bad:
        way = "up to" if target.layer > source.layer else "sideways to"
        lines.append(f"{e.path.relative_to(root)}:{e.line}: {e.statement}\n"
                     f"    {e.source} ({source.unit}, layer {source.layer}) imports {way} "
                     f"{e.target} ({target.unit}, layer {target.layer})")
    return "\n".join(lines)


def test_every_tokenpos_module_sits_on_a_layer() -> None:
    modules = module_names(SRC, "tokenpos")
    missing = sorted(m for m in modules if place(m, LAYERS) is None)
    assert not missing, f"modules on no layer (give each a place in LAYERS): {missing}"
    entries = [entry for units in LAYERS for names in units.values() for entry in names]
    assert len(entries) == len(set(entries))
    assert not [e for e in entries if e not in modules], "LAYERS names a module that is gone"


def test_tokenpos_imports_go_one_way() -> None:
    edges = import_edges(SRC, "tokenpos")
    assert len({e.source for e in edges}) > 20                            # the walk really read the package
    bad = wrong_way(edges, LAYERS)
    assert not bad, f"{len(bad)} import(s) against the layers of docs/DESIGN.md:\n{describe(bad, SRC)}"


# ---------------------------------------------------------------------------------------------- the checker itself

TOY: tuple[dict[str, tuple[str, ...]], ...] = (
    {"base": ("pkg", "pkg._conf")},
    {"low": ("pkg.low",)},
    {"a": ("pkg.a",), "b": ("pkg.b",)},
    {"top": ("pkg.top",)},
)


def toy_package(tmp_path: Path, files: dict[str, str]) -> Path:
    return write_package(tmp_path, {"pkg/__init__.py": "", "pkg/_conf.py": "", "pkg/low/__init__.py": "",
                                    "pkg/low/x.py": "", "pkg/a.py": "", "pkg/b.py": "", "pkg/top.py": "", **files})


def test_imports_down_and_inside_a_unit_pass(tmp_path: Path) -> None:
    src = toy_package(tmp_path, {
        "pkg/top.py": "import pkg.a\nfrom pkg.b import f\nfrom pkg import _conf\nfrom pkg.low import x\n",
        "pkg/a.py": "from pkg.low.x import g\nfrom pkg import VERSION\n",
        "pkg/low/__init__.py": "from pkg.low.x import g\n",
        "pkg/low/x.py": "from . import y\nfrom pkg._conf import C\n",
        "pkg/low/y.py": "",
    })
    edges = import_edges(src, "pkg")
    assert len(edges) == 9
    assert wrong_way(edges, TOY) == []


def test_imports_up_or_sideways_fail_with_file_line_and_statement(tmp_path: Path) -> None:
    src = toy_package(tmp_path, {
        "pkg/low/x.py": "import os\n\ndef f():\n    from pkg.a import thing\n    return thing\n",   # deferred: counts
        "pkg/a.py": "from .b import helper\n",                                                     # sideways
        "pkg/_conf.py": "import importlib\nM = importlib.import_module('pkg.top')\n",              # up from the base
    })
    bad = wrong_way(import_edges(src, "pkg"), TOY)
    assert sorted((e.source, e.target, e.line) for e, _, _ in bad) == [
        ("pkg._conf", "pkg.top", 2), ("pkg.a", "pkg.b", 1), ("pkg.low.x", "pkg.a", 4)]
    text = describe(bad, src)
    assert ("pkg/low/x.py:4: from pkg.a import thing\n"
            "    pkg.low.x (low, layer 1) imports up to pkg.a (a, layer 2)") in text
    assert ("pkg/a.py:1: from .b import helper\n"
            "    pkg.a (a, layer 2) imports sideways to pkg.b (b, layer 2)") in text


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    src = toy_package(tmp_path, {
        "pkg/low/x.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import T\n"
                         "else:\n    from pkg.b import B\n"),
    })
    bad = wrong_way(import_edges(src, "pkg"), TOY)
    assert [(e.target, e.line) for e, _, _ in bad] == [("pkg.b", 5)]


@pytest.mark.parametrize("module, expected", [
    ("pkg", Place(0, "base")),
    ("pkg._conf", Place(0, "base")),
    ("pkg.low", Place(1, "low")),
    ("pkg.low.deep.er", Place(1, "low")),
    ("pkg.top", Place(3, "top")),
    ("pkg.new", None),                                   # the split root package covers its __init__ only
    ("pkg.b2", None),
    ("other", None),
])
def test_modules_are_placed_by_their_longest_entry(module: str, expected: Place | None) -> None:
    assert place(module, TOY) == expected
