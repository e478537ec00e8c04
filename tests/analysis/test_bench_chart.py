"""The report's benchmark chart and table: a legend whose swatches are the bars' colours, the torch.compile bars
or the reason they are absent, rows measured under load or with unstable reps marked and not drawn as results,
and ``tokenpos bench``'s table never claiming an unstable ratio."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from tokenpos.analysis.bench_chart import (  # noqa: E402
    COLORS,
    HATCH,
    NOT_A_RESULT,
    figure_bench,
    ratio_points,
)
from tokenpos.analysis.bench_timing import (  # noqa: E402
    COMPILE,
    EAGER,
    GATHER,
    RATIO_AGREEMENT,
    BenchReport,
    bench_rows,
)


def _rows(compile_: bool = True) -> list:
    """A forward case (the public layer against the gather limit, eager, compile) and a block case."""
    times = {GATHER: [1.0, 1.1, 1.05], EAGER: [3.0, 3.3, 3.1], "tokenpos torch (public layer)": [1.1, 1.2, 1.15]}
    if compile_:
        times[COMPILE] = [1.2, 1.3, 1.25]
    rows = bench_rows("forward", times, 1e6, limit=(GATHER,))
    block = {EAGER: [2.0, 2.2, 2.1], "tokenpos layers, eager": [1.8, 1.9, 1.85]}
    if compile_:
        block[COMPILE] = [1.5, 1.6, 1.55]
    return rows + bench_rows("block", block, 0, bandwidth=False)


def _bars(fig) -> list[Rectangle]:  # noqa: ANN001
    ax = fig.axes[0]
    return [p for c in ax.containers for p in c.patches]


def test_legend_swatches_are_the_bars_colours_and_labels_name_each_reference_once() -> None:
    rows = _rows()
    fig = figure_bench(rows)
    ax = fig.axes[0]
    pts = ratio_points(rows)
    bars = _bars(fig)
    assert len(bars) == len(pts)
    legend = {t.get_text(): to_hex(h.get_facecolor()) for t, h in
              zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles, strict=True)}
    assert legend == {"x limit (gather / copy)": COLORS["limit"], "x torch eager": COLORS["eager"],
                      "x torch.compile": COLORS["compile"]}
    for bar, p in zip(bars, pts, strict=True):                       # every bar: its reference's swatch
        assert p.status == "ok" and to_hex(bar.get_facecolor()) == COLORS[p.key]
    assert set(to_hex(b.get_facecolor()) for b in bars) == set(legend.values())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "block: tokenpos layers, eager vs torch eager" in labels
    assert not any(re.search(r"\((eager|limit|compile)\)", lab) for lab in labels)   # no "eager (eager)"
    assert "no torch.compile bars" not in ax.get_title()


def test_without_compile_rows_the_chart_and_table_say_why() -> None:
    rows = _rows(compile_=False)
    fig = figure_bench(rows)
    ax = fig.axes[0]
    assert "no torch.compile bars" in ax.get_title()
    assert "x torch.compile" not in [t.get_text() for t in fig.legends[0].get_texts()]
    from tokenpos.analysis.report import bench_html

    page = bench_html(BenchReport("m", "tokenpos bench --quick", {}, rows), "default")
    assert "x compile" not in page and "did not time torch.compile" in page


def test_rows_measured_under_load_are_greyed_hatched_and_not_results(tmp_path: Path) -> None:
    rows = _rows()
    for r in rows:
        r.other_cpus = 0.9 if r.case == "forward" else 0.01
    pts = ratio_points(rows)
    fig = figure_bench(rows)
    for bar, p in zip(_bars(fig), pts, strict=True):
        if p.label.startswith("forward"):
            assert p.status == "competed"
            assert to_hex(bar.get_facecolor()) == NOT_A_RESULT and bar.get_hatch() == HATCH
            assert to_hex(bar.get_edgecolor()) == COLORS[p.key]
        else:
            assert p.status == "ok" and to_hex(bar.get_facecolor()) == COLORS[p.key]
    ax = fig.axes[0]
    assert any("[under load]" in t.get_text() for t in ax.get_yticklabels())
    handles = dict(zip((t.get_text() for t in fig.legends[0].get_texts()), fig.legends[0].legend_handles,
                       strict=True))
    assert handles["not a result: under load or unstable"].get_hatch() == HATCH
    from tokenpos.analysis.report import bench_html

    page = bench_html(BenchReport("m", "tokenpos bench", {}, rows), "default", tmp_path, 60, [])
    assert "1 of 2 rows were measured while other processes kept the CPUs busy" in page
    assert "under load (0.90 CPUs taken by others): not a result" in page


def test_the_12x_limit_of_issue_49_is_not_claimed() -> None:
    """``bench --quick`` under load: a layer's best rep 2.07 ms against a 31.99 ms median showed "12.22x limit"
    although its median ratio was 0.91. Best and median disagree 13x: the ratio is unstable, not claimed, and
    the chart greys it."""
    ms = 1e-3
    times = {GATHER: [25.3 * ms, 29 * ms, 30 * ms], EAGER: [80 * ms, 88 * ms, 90 * ms],
             "tokenpos torch (public layer)": [2.07 * ms, 31.99 * ms, 33 * ms]}
    rows = bench_rows("forward", times, 1e6, limit=(GATHER,))
    layer = rows[-1]
    assert layer.ratio_vs_limit == pytest.approx(12.22, abs=0.01)
    assert layer.median_ratios["limit"] == pytest.approx(29 / 31.99)
    assert layer.unstable == ("eager", "limit")        # the lucky rep was the layer's: both its ratios disagree
    pts = {(p.label, p.key): p for p in ratio_points(rows)}
    assert pts["forward: tokenpos torch", "limit"].status == "unstable"
    from tokenpos.cli.bench import _pair, _row_note

    assert _pair(layer.ratio_vs_limit, layer.median_ratios["limit"], "limit" in layer.unstable) == "unstable"
    assert "x limit 12.22/0.91" in _row_note(layer)                  # the note shows both
    from tokenpos.analysis.report import bench_html

    page = bench_html(BenchReport("m", "tokenpos bench --quick", {}, rows), "default")
    assert "unstable (not claimed)" in page and "12.22 /" not in page


@pytest.mark.parametrize(("layer", "unstable"), [
    ([1.0, 2.0, 1.9], ()),                  # the row's reps spread 1.9x (model conditions): ratios agree, claimed
    ([1.0, 1.3, 1.2], ()),
    ([0.3, 1.0, 1.1], ("limit", "eager")),  # best ratio 3.3x its median: neither claimed
])
def test_a_ratio_is_claimed_when_its_best_and_median_agree_within_the_limit(layer: list[float],
                                                                             unstable: tuple[str, ...]) -> None:
    times = {GATHER: [1.0, 1.1, 1.0], EAGER: [3.0, 3.1, 3.0], "tokenpos torch (public layer)": layer}
    row = bench_rows("forward", times, 1e6, limit=(GATHER,))[-1]
    assert sorted(row.unstable) == sorted(unstable)
    for key in ("limit", "eager"):
        best = row.ratio_vs_limit if key == "limit" else row.ratio_vs_reference
        assert (key in row.unstable) == (max(best, row.median_ratios[key]) / min(best, row.median_ratios[key])
                                         > RATIO_AGREEMENT)


def test_run_bench_marks_each_case_with_its_own_competition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters are read at every case boundary: the rows of a case that ran under load are marked
    competed, those of a quiet case are not, and the run's competition spans all of them."""
    from tokenpos.analysis import bench
    from tokenpos.analysis.bench_timing import BenchRow, Competition, CpuCounters

    readings = iter([CpuCounters(100.0, 5.0, 1000.0, 4), CpuCounters(106.0, 5.5, 1010.0, 4),    # jit: 5.5 / 10
                     CpuCounters(112.0, 11.4, 1020.0, 4)])                                      # calls: 0.1 / 10
    monkeypatch.setattr(bench, "cpu_counters", lambda: next(readings))
    monkeypatch.setattr(bench, "_jit_case", lambda quick: [BenchRow("jit", "a", 1.0, 0.0, None, None)])
    monkeypatch.setattr(bench, "calls_case", lambda cfg: [BenchRow("calls", "b", 1.0, 0.0, None, None)])
    report = bench.run_bench(cases=["jit", "calls"])
    jit, calls = report.rows
    assert jit.other_cpus == pytest.approx(0.55) and jit.competed
    assert calls.other_cpus == pytest.approx(0.01) and not calls.competed
    assert report.competition == Competition(pytest.approx(5.6), 20.0, 4)
