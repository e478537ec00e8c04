"""Figures of the extrapolation study.

- :func:`plot_extrapolation`: perplexity and R(k) against eval length, one line per scheme, one row
  of two panels per protocol; with several seeds every point is the mean with a 95 % interval bar. The
  perplexity panel draws the add-k n-gram baselines (dotted, flat: they have no positions), the R(k) curves'
  yardstick in the tables and the gate; a scheme that
  fails the context gate (gate.py) is faded and labelled "does not use context", as in the tables.

Every figure draws a scheme in its one colour, :func:`scheme_color` (keyed by name, not by position in a
figure's list), so a scheme looks the same in the extrapolation, task and curve figures.
- :func:`plot_tasks`: exact-match accuracy against input length, one panel per synthetic task,
  with the interval as a bar and the training range shaded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, passes
from tokenpos.analysis.extrapolate.render import PROTOCOL_TITLES, protocols


def _doc(result: Any) -> dict[str, Any]:
    return result.to_dict() if hasattr(result, "to_dict") else result


def scheme_names() -> tuple[str, ...]:
    """Every line name a study can draw, in a fixed order: the study's schemes (``schemes.SCHEMES``), then each
    rotary scheme's inference-time scalings (``rope+linear``, ...)."""
    from tokenpos.analysis.extrapolate.experiment import ROPE_SCALINGS
    from tokenpos.analysis.extrapolate.schemes import ROTARY_SCHEMES, SCHEMES

    return SCHEMES + tuple(f"{s}+{t}" for s in ROTARY_SCHEMES for t in ROPE_SCALINGS)


# the scalings' lines (dashed): tab10's tenth colour and five dark ones far from tab10's
SCALING_COLORS = ("#17becf", "#000000", "#393b79", "#8c6d31", "#843c39", "#7b4173")


def scheme_color(name: str) -> Any:
    """The one colour of scheme ``name`` in every figure of the study (extrapolation, tasks, curves): the
    schemes take tab10's colours, the scalings :data:`SCALING_COLORS` (all distinct, :func:`scheme_names`); a
    name outside
    the registry (an older document) a tab20c colour chosen from its CRC-32, the same in every figure."""
    import zlib

    from matplotlib import colormaps

    from tokenpos.analysis.extrapolate.schemes import SCHEMES

    names, k = scheme_names(), len(SCHEMES)                 # k <= 9 schemes: one tab10 colour each
    if name in names:
        i = names.index(name)
        return colormaps["tab10"](i) if i < k else SCALING_COLORS[(i - k) % len(SCALING_COLORS)]
    return colormaps["tab20c"](zlib.crc32(name.encode()) % 20)


def _yerr(rows: list[dict[str, Any]], key: str) -> list[list[float]] | None:
    """Asymmetric error bars [[below...], [above...]] from ``<key>_ci``, or None without intervals."""
    if not rows or not all(r.get(f"{key}_ci") for r in rows):
        return None
    return [[max(0.0, r[key] - r[f"{key}_ci"][0]) for r in rows], [max(0.0, r[f"{key}_ci"][1] - r[key]) for r in rows]]


def plot_extrapolation(result: Any, path: str | Path) -> Path:
    """Write the figure (PNG, SVG or PDF by suffix) and return the path.

    Per protocol: left, perplexity at each eval length; right, R(k) with 1 marked. A y axis is
    logarithmic when its values span more than 4x. RoPE's inference-time scalings are dashed.
    Points that cannot run (learned past L) are left out.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend switch, nothing to close
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    data = _doc(result)
    L = data["train_len"]
    protos = protocols(data) or ["nonoverlap"]              # no results at all: one empty panel that says so
    fig = Figure(figsize=(12.5, 4.2 * len(protos)))
    axes = fig.subplots(len(protos), 2, squeeze=False)
    for (ax_ppl, ax_r), protocol in zip(axes, protos, strict=True):
        results = [r for r in data["results"] if r.get("protocol", "nonoverlap") == protocol]
        lens = sorted({r["eval_len"] for r in results})
        values: dict[str, list[float]] = {"ppl": [], "ratio": []}
        schemes: list[str] = []
        for r in results:
            if r["scheme"] not in schemes:
                schemes.append(r["scheme"])
        for scheme in schemes:
            rows = sorted((r for r in results if r["scheme"] == scheme and r["ppl"] is not None),
                          key=lambda r: r["eval_len"])
            if not rows:
                continue
            style = "--" if "+" in scheme else "-"
            x = [r["eval_len"] for r in rows]
            uses = passes(data, scheme)             # below the 4-gram at L; else its R(k) says nothing (gate.py)
            for ax, key in ((ax_ppl, "ppl"), (ax_r, "ratio")):
                ax.errorbar(x, [r[key] for r in rows], yerr=_yerr(rows, key), fmt=style, marker="o", ms=3,
                            capsize=2, label=scheme if uses else f"{scheme} ({FAIL_TEXT})",
                            color=scheme_color(scheme), alpha=1.0 if uses else 0.35)
                values[key] += [r[key] for r in rows] + [c for r in rows for c in (r.get(f"{key}_ci") or [])
                                                         if c > 0]
        grams = sorted((g for g in data.get("ngram", []) if g["protocol"] == protocol), key=lambda g: g["order"])
        for j, g in enumerate(grams):                # the baselines the gate compares against: no positions, flat
            ppl = math.exp(g["nll"])
            label = f"{g['order']}-gram (add-k {g['k']:g})"
            ax_ppl.axhline(ppl, color=str(0.2 + 0.2 * j), lw=1.0, ls=":", label=label)
            ax_ppl.annotate(label, (1.0, ppl), xycoords=("axes fraction", "data"), xytext=(-3, 2),
                            textcoords="offset points", ha="right", va="bottom", fontsize=6.5, color="0.25")
            values["ppl"].append(ppl)
        for ax, key in ((ax_ppl, "ppl"), (ax_r, "ratio")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(lens, [str(t) for t in lens])
            ax.xaxis.set_minor_formatter(NullFormatter())
            positive = [v for v in values[key] if v > 0]
            if positive and max(positive) / max(min(positive), 1e-12) > 4:   # log only for wide ranges
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.axvline(L, color="grey", lw=0.8, ls=":")
            ax.set_xlabel(f"eval length (train length L = {L})")
            ax.grid(alpha=0.3)
        title = PROTOCOL_TITLES.get(protocol, protocol)
        ax_ppl.set_ylabel(f"perplexity ({title})")
        ax_r.axhline(1.0, color="black", lw=0.8)
        ax_r.set_ylabel("R(k) = NLL at kL / at L" if protocol == "sliding" else "R(k) = tail NLL at kL / at L")
        if values["ratio"]:                                  # no line at all (every run diverged): no legend
            ax_r.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
            if data.get("gate") and not any(passes(data, s) for s in schemes):
                ax_r.text(0.5, 0.5, f"every scheme: {FAIL_TEXT}\n(none beat the 4-gram at L): no R(k) here is a "
                          "result", ha="center", va="center", fontsize=9, color="0.3", transform=ax_r.transAxes)
        else:
            ax_r.text(0.5, 0.5, "nothing to plot: no scheme has a result", ha="center", transform=ax_r.transAxes)
    seeds = " (mean and 95% interval over seeds)" if "interval" in data else ""
    fig.suptitle(f"Train short, test long (character LM){seeds}")
    fig.tight_layout()
    from tokenpos.analysis.figures import save

    return save(fig, path, 110)          # atomic: an interrupted run never leaves a partial figure


def plot_tasks(result: Any, path: str | Path) -> Path:
    """Accuracy against input length, one panel per synthetic task; the training range is shaded.

    Raises:
        ValueError: the document has no ``task_results``.
    """
    from matplotlib.figure import Figure

    data = _doc(result)
    entries = data.get("task_results") or []
    if not entries:
        raise ValueError("the document has no task_results; run with --tasks or --full")
    tasks = sorted({e["task"] for e in entries})
    train_len = (data.get("config", {}).get("task") or {}).get("train_len")
    fig = Figure(figsize=(6.5 * len(tasks) + 1.5, 4.2))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        schemes: list[str] = []
        for e in entries:
            if e["task"] == task and e["scheme"] not in schemes:
                schemes.append(e["scheme"])
        for scheme in schemes:
            rows = sorted((e for e in entries if e["task"] == task and e["scheme"] == scheme
                           and e["accuracy"] is not None), key=lambda e: e["length"])
            if not rows:
                continue
            yerr = [[100 * (e["accuracy"] - e["accuracy_ci"][0]) for e in rows],
                    [100 * (e["accuracy_ci"][1] - e["accuracy"]) for e in rows]] \
                if all(e.get("accuracy_ci") for e in rows) else None
            ax.errorbar([e["length"] for e in rows], [100 * e["accuracy"] for e in rows], yerr=yerr, marker="o",
                        ms=3, capsize=2, label=scheme, color=scheme_color(scheme))
        if train_len:
            ax.axvspan(0, train_len, color="grey", alpha=0.12, lw=0)
        ax.set_title(f"{task}")
        ax.set_xlabel("input length 2n (shaded: training lengths)")
        ax.set_ylabel("exact-match accuracy (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("Synthetic tasks: trained at input length <= "
                 f"{train_len if train_len else '?'}, exact match by length (95% interval)")
    fig.tight_layout()
    from tokenpos.analysis.figures import save

    return save(fig, path, 110)          # atomic: an interrupted run never leaves a partial figure


def plot_curves(result: Any, path: str | Path) -> Path:
    """NLL against position in the window (the tail protocol's windows at the longest length), one line per
    scheme with its 95 % interval over seeds as a band; L marked. Returns the path.

    Raises:
        ValueError: the document has no ``curves`` (run with the ``nonoverlap`` protocol).
    """
    from matplotlib.figure import Figure

    data = _doc(result)
    curves = data.get("curves", [])
    if not curves:
        raise ValueError("the document has no curves; run with --eval nonoverlap or both")
    longest = max(c["eval_len"] for c in curves)
    fig = Figure(figsize=(8.0, 4.2))
    ax = fig.subplots()
    for c in (c for c in curves if c["eval_len"] == longest):
        x = [(b + 0.5) * c["bin_width"] for b in range(len(c["nll"]))]
        ax.plot(x, c["nll"], marker="o", ms=3, label=c["scheme"], color=scheme_color(c["scheme"]),
                ls="--" if "+" in c["scheme"] else "-")
        if all(ci is not None for ci in c["nll_ci"]):
            ax.fill_between(x, [ci[0] for ci in c["nll_ci"]], [ci[1] for ci in c["nll_ci"]],
                            color=scheme_color(c["scheme"]),
                            alpha=0.15, lw=0)
    ax.axvline(data["train_len"], color="grey", lw=1, ls=":")
    ax.set_xlabel(f"position in a window of {longest} (dotted: L = {data['train_len']})")
    ax.set_ylabel("NLL (nats/char), bin mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("NLL by position (95% interval over seeds)")
    fig.tight_layout()
    from tokenpos.analysis.figures import save

    return save(fig, path, 110)
