"""The benchmark at a glance: tokenpos's model-condition ratios as a chart, and the table under it.

:func:`headline_rows` picks what a person compares: the public layers (``"(public layer)"`` rows)
and the end-to-end block's tokenpos rows. References, raw kernels and the experiment rows
(compute floor, the numba gather) stay in ``tokenpos bench``'s own output.
:func:`ratio_points` turns each into (label, reference, median ratio, best ratio) points;
:func:`figure_bench` draws them: one horizontal bar per point at its median ratio, a whisker to its
best, a line at 1.0 (> 1: tokenpos faster than that reference).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tokenpos.analysis.figures import new_figure, save

REFS = (("limit", "ratio_vs_limit", "x limit (gather / copy)"), ("eager", "ratio_vs_reference", "x torch eager"),
        ("compile", "ratio_vs_compile", "x torch.compile"))
COLORS = {"limit": "#7a7f8a", "eager": "#2b5fab", "compile": "#d08a00"}


def headline_rows(rows: list[Any]) -> list[Any]:
    """The rows the report shows: timed public-layer rows and the block's tokenpos rows (in order)."""
    def timed(r: Any) -> bool:
        return r.seconds is not None and math.isfinite(r.seconds) and r.seconds > 0
    return [r for r in rows if timed(r) and ("(public layer)" in r.impl
                                              or (r.case == "block" and r.impl.startswith("tokenpos")))]


def ratio_points(rows: list[Any]) -> list[tuple[str, str, float, float]]:
    """``(label, reference key, median ratio, best ratio)`` for each headline row and reference it has."""
    out = []
    for r in headline_rows(rows):
        meds = getattr(r, "median_ratios", None)
        meds = {} if meds is None else meds
        for key, attr, _ in REFS:
            best = getattr(r, attr, None)
            if best is None or not math.isfinite(best):
                continue
            med = meds.get(key)
            out.append((f"{r.case}: {r.impl.replace(' (public layer)', '')}", key,
                        float(med) if med is not None and math.isfinite(med) else float(best), float(best)))
    return out


def figure_bench(rows: list[Any]) -> Any:
    """Horizontal bars: median ratio per (row, reference), whisker to the best ratio, a line at 1."""
    pts = ratio_points(rows)
    fig = new_figure(9.0, max(2.5, 0.28 * len(pts) + 1.2))
    ax = fig.add_subplot()
    y = list(range(len(pts)))[::-1]
    for yi, (_, key, med, best) in zip(y, pts, strict=True):
        ax.barh(yi, med, color=COLORS[key], height=0.7)
        ax.plot([min(med, best), max(med, best)], [yi, yi], color="black", lw=1.2)
        ax.plot([best], [yi], "|", color="black", ms=8)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{label} ({key})" for label, key, _, _ in pts], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("reference time / tokenpos time, median (bar) and best (whisker); > 1: tokenpos faster")
    for key, _, name in REFS:
        ax.barh([], [], color=COLORS[key], label=name)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title("tokenpos in model conditions (each call right after a torch op)", fontsize=10)
    return fig


def plot_bench(rows: list[Any], path: str | Path, dpi: int = 110) -> Path:
    """:func:`figure_bench` written to ``path``."""
    return save(figure_bench(rows), path, dpi=dpi)
