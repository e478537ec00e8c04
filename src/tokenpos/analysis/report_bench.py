"""The report's benchmark section as HTML: the headline chart and table (:func:`bench_html`), then the host-time
chart and table of the ``calls`` rows (:func:`calls_html`).

The rows are :mod:`.bench_timing`'s (a ``BenchReport``); which of them a person compares and how they are
drawn is :mod:`.bench_chart`'s. ``tokenpos report`` runs the bench and puts this section on its page
(:mod:`.report`); every text that comes from data is escaped by :mod:`.report_html`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenpos.analysis import report_html as H

# bench arguments per mode: quick = a subset of the quick cases, default = every quick case, full = the full bench
BENCH_QUICK_CASES = ("forward", "rope", "train_lazy", "calls")


def _num(x: Any, fmt: str) -> str:
    return "" if x is None or x != x else format(x, fmt)  # None and NaN: empty cell


def _pair(best: Any, median: Any, unstable: bool = False) -> str:
    if best is None:
        return ""
    return "unstable (not claimed)" if unstable else f"{_num(best, '.2f')} / {_num(median, '.2f')}"


def _status(r: Any) -> str:
    """What the row's numbers are: a result, or why not (measured under load; unstable ratios)."""
    from tokenpos.analysis.bench_timing import unstable_of

    out = []
    if getattr(r, "competed", False):
        out.append(f"under load ({r.other_cpus:.2f} CPUs taken by others): not a result")
    unstable = unstable_of(r)
    if unstable:
        out.append(f"unstable x {', x '.join(unstable)}: best and median disagree")
    return "; ".join(out) or "result"


def bench_html(rep: Any, mode: str, out_dir: Path | None = None, dpi: int = 110,
               images: list[Path] | None = None) -> str:
    """The BenchReport at a glance: the chart of tokenpos's ratios (when ``out_dir`` is given), then
    the table of the same rows: public layers and the block, no experiment rows (:mod:`.bench_chart`);
    then, when the report has ``calls`` rows, their host-time chart and table (:func:`calls_html`).

    Every number comes with its spread (best and median). A row measured while other processes kept the CPUs
    busy (its case's competition, :mod:`.bench_timing`) is marked "not a result", in the chart (grey,
    hatched) and the table; a ratio whose best and median disagree by more than RATIO_AGREEMENT is
    "unstable (not claimed)". Without a torch.compile ratio the "x compile" column is left out and the
    note says why."""
    from tokenpos.analysis.bench_chart import NO_COMPILE, headline_rows, plot_bench, ratio_points
    from tokenpos.analysis.bench_timing import RATIO_AGREEMENT, busy_note, unstable_of

    shown = headline_rows(rep.rows)
    compiled = any(getattr(r, "ratio_vs_compile", None) is not None for r in shown)
    rows = []
    for r in shown:
        m = getattr(r, "median_ratios", None)
        m = {} if m is None else m
        u = unstable_of(r)
        med = getattr(r, "median_seconds", None)
        rows.append([r.case, r.impl, _num(r.seconds * 1e3, ".3f"), _num(None if med is None else med * 1e3, ".3f"),
                     _pair(getattr(r, "ratio_vs_limit", None), m.get("limit"), "limit" in u),
                     _pair(r.ratio_vs_reference, m.get("eager"), "eager" in u)]
                    + ([_pair(getattr(r, "ratio_vs_compile", None), m.get("compile"), "compile" in u)]
                       if compiled else []) + [_status(r)])
    meta = [{"quick": f"quick run, cases {', '.join(BENCH_QUICK_CASES)} only", "default": "quick run",
             "full": "full run"}[mode]]
    for name in ("machine", "command"):
        value = getattr(rep, name, None)
        if value:
            meta.append(f"{name}: {value}")
    busy = busy_note(getattr(rep, "competition", None))
    if busy:
        meta.append(busy)
    if shown and not compiled:
        meta.append(NO_COMPILE)
    competed = [r for r in shown if getattr(r, "competed", False)]
    if competed:
        meta.append(f"{len(competed)} of {len(shown)} rows were measured while other processes kept the CPUs busy: "
                    "they are not results (grey, hatched in the chart); rerun the report on a quiet machine")
    chart = ""
    if out_dir is not None and ratio_points(rep.rows):
        png = plot_bench(rep.rows, out_dir / "bench.png", dpi=dpi)
        if images is not None:
            images.append(png)
        chart = H.figure(png, "tokenpos against the limit, torch eager and torch.compile, each call timed right "
                              "after a torch op as in a model; bar: median ratio, whisker: best; grey hatched "
                              "bars are not results (measured under load, or unstable)", alt="bench chart")
    heads = ["case", "tokenpos", "best ms", "median ms", "x limit", "x eager"] + (["x compile"] if compiled else [])
    return (H.paragraphs(["; ".join(str(m) for m in meta)], "note") + chart
            + H.table(heads + ["status"], rows, numeric=set(range(2, len(heads))),
                      caption="tokenpos bench in model conditions: ratios are reference time / tokenpos time, "
                              "best / median (> 1: tokenpos faster); every reference was timed in the same run. "
                              "Limit: the random-row gather (embedding) or copy bandwidth (RoPE). A ratio is "
                              f"'unstable (not claimed)' where its best and its median differ by more than "
                              f"{RATIO_AGREEMENT:g}x.")
            + calls_html(rep.rows, out_dir, dpi, images))


def calls_html(rows: list[Any], out_dir: Path | None = None, dpi: int = 110, images: list[Path] | None = None) -> str:
    """The ``calls`` rows (:mod:`.bench_calls`): a chart of each row's ratio tokenpos / reference (when
    ``out_dir`` is given), then their table; empty when there are none."""
    from tokenpos.analysis.bench_chart import CALLS, calls_points, plot_calls

    calls = [r for r in rows if r.case == CALLS]
    if not calls:
        return ""
    chart = ""
    if out_dir is not None and calls_points(calls):
        png = plot_calls(calls, out_dir / "bench_calls.png", dpi=dpi)
        if images is not None:
            images.append(png)
        chart = H.figure(png, "Host time of a call (CPU time of the calling thread), tokenpos / reference: bar from "
                              "1.0 to the median of the rounds' ratios, whisker: its 95% interval, diamond: best / "
                              "best; < 1: tokenpos costs less", alt="calls chart")
    table = []
    for r in calls:
        h = getattr(r, "host", None)
        if h is None:                                   # a row that could not run: its note
            table.append([r.impl, r.note, "", "", "", "", "", "", ""])
            continue
        t = h.trace
        table.append([r.impl, h.reference, _num(h.seconds * 1e6, ".1f"), _num(h.reference_seconds * 1e6, ".1f"),
                      f"{h.ratio:.2f} [{h.ratio_low:.2f}, {h.ratio_high:.2f}]", _num(h.ratio_best, ".2f"),
                      "" if t is None else len(t.functions), "" if t is None else t.lines,
                      "" if t is None else t.span])
    return "<h3>Host time of a call</h3>" + chart + H.table(
        ["tokenpos call", "reference", "tokenpos us", "reference us", "tokenpos / reference [95%]", "best / best",
         "functions", "lines", "span"], table, numeric={2, 3, 4, 5, 6, 7, 8},
        caption="CPU time of the calling thread per call (time.thread_time), median over rounds that alternate a "
                "block of tokenpos calls and a block of reference calls in one process (torch on one thread): "
                "other processes do not count in it. Ratio: tokenpos / reference, the median of the rounds' "
                "ratios [95% bootstrap interval], and best / best (< 1: tokenpos costs less). Functions, lines: "
                "tokenpos functions entered and distinct tokenpos source lines run by one call; span: the source "
                "lines of those functions.")
