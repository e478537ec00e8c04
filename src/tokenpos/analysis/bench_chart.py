"""The benchmark at a glance: tokenpos's model-condition ratios as a chart, and the table under it.

:func:`headline_rows` picks what a person compares: the public layers (``"(public layer)"`` rows)
and the end-to-end block's tokenpos rows. References, raw kernels and the experiment rows
(compute floor, the numba gather) stay in ``tokenpos bench``'s own output.
:func:`ratio_points` turns each into (label, reference, median ratio, best ratio) points;
:func:`figure_bench` draws them: one horizontal bar per point from 1.0 to its median ratio, a whisker to its
best, a line at 1.0 (> 1: tokenpos faster than that reference). The legend's swatches are the bars' colours
(one per reference); a bar that is not a result (its case ran under load, or its reps were unstable:
:class:`Point`) is grey and hatched and its label says why; a run without torch.compile rows says so
in the chart (:data:`NO_COMPILE`).

The ``calls`` case (host time, :mod:`.bench_calls`) has a chart of its own, the other way round as its
rows are: :func:`calls_points` / :func:`figure_calls` show each row's ratio tokenpos / reference (< 1:
tokenpos costs less host time), a bar from 1.0 to the median of the rounds' ratios, its 95 % interval
and the best / best ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenpos.analysis.bench_timing import unstable_of
from tokenpos.analysis.figures import new_figure, save

REFS = (("limit", "ratio_vs_limit", "x limit (gather / copy)"), ("eager", "ratio_vs_reference", "x torch eager"),
        ("compile", "ratio_vs_compile", "x torch.compile"))
COLORS = {"limit": "#7a7f8a", "eager": "#2b5fab", "compile": "#d08a00"}
VS = {"limit": "vs limit", "eager": "vs torch eager", "compile": "vs torch.compile"}
NOT_A_RESULT = "#d9d9d9"      # the fill of a bar that is not a result (competed or unstable); hatched
HATCH = "////"
NO_COMPILE = ("no torch.compile bars: this run did not time torch.compile (a quick run skips it; "
              "tokenpos report --full and tokenpos bench --compile time it)")
NO_COMPILE_SHORT = "no torch.compile bars: not timed in this run (quick runs skip it; report --full times it)"


@dataclass(frozen=True)
class Point:
    """One bar: a headline row against one reference. ``status``: "ok" (a result), "unstable" (its best and
    median ratios disagree by more than RATIO_AGREEMENT: not claimed) or "competed" (the case ran while other
    processes kept more than BUSY_CPUS CPUs busy: not a result)."""

    label: str
    key: str
    median: float
    best: float
    status: str = "ok"

    def __iter__(self) -> Iterator[Any]:        # (label, key, median, best), as the points were tuples
        return iter((self.label, self.key, self.median, self.best))


def headline_rows(rows: list[Any]) -> list[Any]:
    """The rows the report shows: timed public-layer rows and the block's tokenpos rows (in order)."""
    def timed(r: Any) -> bool:
        return r.seconds is not None and math.isfinite(r.seconds) and r.seconds > 0
    return [r for r in rows if timed(r) and ("(public layer)" in r.impl
                                              or (r.case == "block" and r.impl.startswith("tokenpos")))]


def row_label(r: Any) -> str:
    return f"{r.case}: {r.impl.replace(' (public layer)', '')}"


def point_status(r: Any, key: str) -> str:
    """"competed", "unstable" or "ok" for row ``r``'s ratio against ``key`` (see :class:`Point`)."""
    if getattr(r, "competed", False):
        return "competed"
    return "unstable" if key in unstable_of(r) else "ok"


def ratio_points(rows: list[Any]) -> list[Point]:
    """One :class:`Point` (label, reference key, median ratio, best ratio, status) for each headline row and
    reference it has."""
    out = []
    for r in headline_rows(rows):
        meds = getattr(r, "median_ratios", None)
        meds = {} if meds is None else meds
        for key, attr, _ in REFS:
            best = getattr(r, attr, None)
            if best is None or not math.isfinite(best):
                continue
            med = meds.get(key)
            out.append(Point(row_label(r), key, float(med) if med is not None and math.isfinite(med)
                             else float(best), float(best), point_status(r, key)))
    return out


def figure_bench(rows: list[Any]) -> Any:
    """Horizontal bars: median ratio per (row, reference), whisker to the best ratio, a line at 1.

    A result's bar has its reference's colour (the legend's swatches are those colours). A bar that is not a
    result is grey and hatched, and its label says why: "under load" (its case ran while other processes
    kept the CPUs busy) or "unstable" (its best and median ratios disagree by more than RATIO_AGREEMENT).
    Without any torch.compile ratio the chart says so under its title."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    pts = ratio_points(rows)
    fig = new_figure(9.0, max(2.8, 0.28 * len(pts) + 1.9))
    ax = fig.add_subplot()
    y = list(range(len(pts)))[::-1]
    why = {"competed": "under load", "unstable": "unstable"}
    for yi, p in zip(y, pts, strict=True):
        if p.status == "ok":                                  # from 1.0 (parity) to the median, log axis
            ax.barh(yi, p.median - 1.0, left=1.0, color=COLORS[p.key], height=0.7)
        else:
            ax.barh(yi, p.median - 1.0, left=1.0, color=NOT_A_RESULT, edgecolor=COLORS[p.key], hatch=HATCH,
                    height=0.7, lw=0.8)
        ax.plot([min(p.median, p.best), max(p.median, p.best)], [yi, yi], color="black", lw=1.2)
        ax.plot([p.best], [yi], "|", color="black", ms=8)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{p.label} {VS[p.key]}" + (f" [{why[p.status]}]" if p.status != "ok" else "")
                      for p in pts], fontsize=7)
    ax.set_xscale("log")
    xs = [x for p in pts for x in (p.median, p.best) if x > 0] + [1.0]
    lo, hi = min(xs) / 1.25, max(xs) * 1.25
    ax.set_xlim(lo, hi)
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)
             if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("reference time / tokenpos time: bar median, whisker best; > 1: tokenpos faster", fontsize=8)
    keys = [k for k, _, _ in REFS if any(p.key == k for p in pts)]
    handles = [Patch(facecolor=COLORS[k], label=name) for k, _, name in REFS if k in keys]
    if any(p.status != "ok" for p in pts):
        handles.append(Patch(facecolor=NOT_A_RESULT, edgecolor="black", hatch=HATCH,
                             label="not a result: under load or unstable"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize=7)
    title = "tokenpos in model conditions (each call right after a torch op)"
    if "compile" not in keys:
        title += "\n" + NO_COMPILE_SHORT
    ax.set_title(title, fontsize=9)
    return fig


def plot_bench(rows: list[Any], path: str | Path, dpi: int = 110) -> Path:
    """:func:`figure_bench` written to ``path``."""
    return save(figure_bench(rows), path, dpi=dpi)


# -- the calls case: host time, tokenpos / reference --------------------------------------------------------

CALLS = "calls"
CHEAPER, COSTLIER = "#2f9e44", "#c92a2a"


def calls_points(rows: list[Any]) -> list[tuple[str, float, float, float, float]]:
    """``(label, median ratio, interval low, interval high, best ratio)``, ratios tokenpos / reference, for each
    timed ``calls`` row (its ``host`` numbers), in order; the label names the call and its reference."""
    out = []
    for r in rows:
        h = getattr(r, "host", None)
        if r.case != CALLS or h is None or not all(math.isfinite(x) and x > 0 for x in (h.ratio, h.ratio_best)):
            continue
        out.append((f"{r.impl}\nvs {h.reference}", float(h.ratio), float(h.ratio_low), float(h.ratio_high),
                    float(h.ratio_best)))
    return out


def figure_calls(rows: list[Any]) -> Any:
    """Horizontal bars, one per calls row: from 1.0 to the median of the rounds' ratios tokenpos / reference
    (green: tokenpos cheaper, red: costlier), a black whisker over its 95 % interval, a diamond at best /
    best, a dashed line at 1.0 (the same host time); log x axis, so 0.5 and 2 sit equally far from 1."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    pts = calls_points(rows)
    fig = new_figure(9.5, max(3.0, 0.5 * len(pts) + 1.9))
    ax = fig.add_subplot()
    y = list(range(len(pts)))[::-1]
    for yi, (_, med, low, high, best) in zip(y, pts, strict=True):
        ax.barh(yi, med - 1.0, left=1.0, color=CHEAPER if med < 1 else COSTLIER, height=0.6)
        ax.plot([low, high], [yi, yi], color="black", lw=1.2)
        ax.plot([best], [yi], "D", color="black", ms=4)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(y, [label for label, *_ in pts], fontsize=6.5)
    ax.set_xscale("log")
    xs = [x for _, *vals in pts for x in vals if x > 0] + [1.0]
    lo, hi = min(xs) / 1.25, max(xs) * 1.25
    ax.set_xlim(lo, hi)
    ticks = [t for t in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0) if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokenpos / reference, CPU time of the calling thread per call; < 1: tokenpos costs less")
    fig.legend(handles=[Patch(color=CHEAPER, label="median of the rounds' ratios, tokenpos cheaper"),
                        Patch(color=COSTLIER, label="median of the rounds' ratios, tokenpos costlier"),
                        Line2D([], [], color="black", lw=1.2, label="95% interval of that median"),
                        Line2D([], [], color="black", marker="D", ms=4, ls="none", label="best / best"),
                        Line2D([], [], color="black", lw=0.8, ls="--", label="1.0: the same host time")],
               loc="outside lower center", ncols=3, fontsize=7)
    ax.set_title("Host time of a call: tokenpos against the torch / HF way (calls case)", fontsize=10)
    return fig


def plot_calls(rows: list[Any], path: str | Path, dpi: int = 110) -> Path:
    """:func:`figure_calls` written to ``path``."""
    return save(figure_calls(rows), path, dpi=dpi)
