"""The extrapolation figure: perplexity and tail-NLL ratio against eval length, one line per scheme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenpos.analysis.extrapolate.results import as_document, schemes_in_order


def plot_extrapolation(result: Any, path: str | Path) -> Path:
    """Write a two-panel figure (PNG, SVG or PDF by suffix) and return the path.

    Left: per-window perplexity at each eval length. Right: R(k) = tail NLL at kL / at L, with 1
    marked. A y axis is logarithmic when its values span more than 4x. RoPE's inference-time
    scalings are dashed. Points that cannot run (learned past L) are left out.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend switch, nothing to close
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    data = as_document(result)
    L = data["train_len"]

    fig = Figure(figsize=(12.5, 4.2))
    ax_ppl, ax_r = fig.subplots(1, 2)
    lens = sorted({r["eval_len"] for r in data["results"]})
    values: dict[str, list[float]] = {"ppl": [], "ratio": []}
    for scheme in schemes_in_order(data):
        rows = sorted((r for r in data["results"] if r["scheme"] == scheme and r["ppl"] is not None),
                      key=lambda r: r["eval_len"])
        if not rows:
            continue
        style = "--" if "+" in scheme else "-"
        x = [r["eval_len"] for r in rows]
        ax_ppl.plot(x, [r["ppl"] for r in rows], style, marker="o", label=scheme)
        ax_r.plot(x, [r["ratio"] for r in rows], style, marker="o", label=scheme)
        for key in values:
            values[key] += [r[key] for r in rows]
    for ax, key in ((ax_ppl, "ppl"), (ax_r, "ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(t) for t in lens])
        ax.xaxis.set_minor_formatter(NullFormatter())
        if values[key] and max(values[key]) / max(min(values[key]), 1e-12) > 4:   # log only for wide ranges
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.axvline(L, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"eval length (train length L = {L})")
        ax.grid(alpha=0.3)
    ax_ppl.set_ylabel("perplexity per window")
    ax_r.axhline(1.0, color="black", lw=0.8)
    ax_r.set_ylabel("R(k) = tail NLL at kL / at L")
    ax_r.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("Train short, test long (character LM)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
