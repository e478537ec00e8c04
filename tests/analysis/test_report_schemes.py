"""Every registered positional scheme in the report's tables and figures (lists derived from
``tokenpos.tables.registry``, not written by hand), and tables that scroll inside an 800 px viewport."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenpos.analysis import report_html as H
from tokenpos.analysis.report import FIGURES, SCHEME_FIGURES, ReportContext, _tradeoff_section
from tokenpos.analysis.tradeoffs import positional_tradeoffs
from tokenpos.tables.registry import SCHEMES, SHORTCUTS


def test_the_tradeoff_tables_list_every_registered_scheme() -> None:
    t = positional_tradeoffs()
    assert sorted(e.scheme for e in t.extrapolation) == sorted(SHORTCUTS)      # fire, kerple, xpos, ... included
    assert sorted(name for name, *_ in t.memory) == sorted(SHORTCUTS)
    assert all(e.finding and e.beyond_max for e in t.extrapolation)
    additive = sorted(n for n, e in SCHEMES.items() if e.kind == "additive")
    shown = " ".join(v.name for v in t.variance)
    assert all(name in shown for name in additive)                           # every additive table has a row


def test_the_report_section_shows_fire_and_kerple_and_names_the_schemes_without_a_variance_row(
        tmp_path: Path) -> None:
    body = _tradeoff_section(ReportContext(tmp_path, "quick", lambda *a: None))
    for name in SHORTCUTS:
        assert f"<td>{name}</td>" in body
    assert "(alibi, fire, kerple, mrope, none, rope, rope2d, t5, xpos) have no row here" in body


def test_the_report_draws_fire_and_kerple_and_places_every_scheme_figure() -> None:
    assert {"fire", "kerple"} <= set(SCHEME_FIGURES)
    assert set(SCHEME_FIGURES) == set(FIGURES) - {"memory"}                   # no figure written but not shown


def test_every_table_scrolls_inside_its_own_box() -> None:
    pytest.importorskip("matplotlib")
    from tokenpos.analysis.bench_timing import EAGER, GATHER, BenchReport, bench_rows
    from tokenpos.analysis.extrapolate.render import html_table
    from tokenpos.analysis.report import CHECKED_IN_STUDY, bench_html, read_extrapolation

    rows = bench_rows("forward", {GATHER: [1.0, 1.1], EAGER: [3.0, 3.1], "tokenpos torch (public layer)": [1.1, 1.2]},
                      1e6, limit=(GATHER,))
    page = H.page("t", "m", [("b", "bench", bench_html(BenchReport("m", "c", {}, rows), "default")),
                             ("e", "extrapolation", html_table(read_extrapolation(CHECKED_IN_STUDY), "sliding")),
                             ("m", "memory", H.table(["a", "b"], [[1, 2]]))])
    tables = [m.start() for m in re.finditer("<table", page)]
    assert len(tables) == 3
    assert all(page[:i].endswith('<div class="table-wrap">') for i in tables)
    assert re.search(r"\.table-wrap \{[^}]*overflow-x: auto", H.CSS)
    assert re.search(r"body \{[^}]*max-width", H.CSS)
