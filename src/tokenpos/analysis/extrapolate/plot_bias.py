"""Figures of the learned bias schemes at initialisation: FIRE and KERPLE, bias against distance.

Both start from the reference code's initial values (seed 0). FIRE is drawn for queries at several
positions (its normaliser depends on the query position beyond the threshold L); KERPLE per head,
with ALiBi's fixed lines for comparison. ``tokenpos plot fire|kerple`` calls these.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DESCRIPTIONS = {"fire": "FIRE's initial bias against distance, per head, for several query positions",
                "kerple": "KERPLE-log's initial bias -r1 log(1 + r2 d) per head, with ALiBi's lines"}


def plot_fire(path: str | Path, *, num_heads: int = 4, seq_len: int = 512, dpi: int = 110) -> Path:
    """FIRE(num_heads, init_L = seq_len / 4) at init: bias[h, i, i - d] against d for i in {L/4, L/2, L}."""
    from matplotlib.figure import Figure

    from tokenpos.analysis.figures import check_size
    from tokenpos.tables.formulas.fire import fire_bias, fire_init

    check_size("num_heads", num_heads)
    check_size("seq_len", seq_len, "fire_seq_len")                 # before any array is built
    params = fire_init(num_heads, 32, np.random.default_rng(0))
    init_L = max(1.0, seq_len / 4)
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    for i, style in ((max(1, seq_len // 4), ":"), (max(1, seq_len // 2), "--"), (seq_len, "-")):
        bias, _ = fire_bias(params, 1, i, init_L=init_L)                   # the query at position i - 1
        d = np.arange(i)[::-1]
        for h in range(num_heads):
            ax.plot(d, bias[h, 0], style, color=f"C{h}", label=f"head {h}" if i == seq_len else None)
    ax.set_xlabel(f"distance i - j (dotted: query at {seq_len // 4}, dashed: {seq_len // 2}, solid: {seq_len}; "
                  f"threshold {init_L:g})")
    ax.set_ylabel("bias (initial MLP)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle("FIRE at initialisation (seed 0): f(log(c d + 1) / log(c max(i, L) + 1))")
    fig.tight_layout()
    from tokenpos.analysis.figures import save

    return save(fig, path, dpi)          # atomic, size- and dpi-bounded, as every other figure


def plot_kerple(path: str | Path, *, num_heads: int = 4, seq_len: int = 256, dpi: int = 110) -> Path:
    """KERPLE-log at init (seed 0) against distance, one line per head; ALiBi's slopes dotted."""
    from matplotlib.figure import Figure

    from tokenpos.analysis.figures import check_size
    from tokenpos.tables.formulas.alibi import alibi_slopes
    from tokenpos.tables.formulas.kerple import kerple_bias, kerple_init

    check_size("num_heads", num_heads)
    check_size("seq_len", seq_len, "kerple_seq_len")               # before any array is built
    r1, r2 = kerple_init(num_heads, np.random.default_rng(0))
    d = np.arange(seq_len, dtype=np.float64)
    bias = kerple_bias(r1, r2, d[None, :])[:, 0]                           # (H, seq_len)
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    for h in range(num_heads):
        ax.plot(d, bias[h], color=f"C{h}", label=f"head {h}: r1 {r1[h]:.2f}, r2 {r2[h]:.2f}")
    for h, slope in enumerate(alibi_slopes(num_heads)):
        ax.plot(d, -slope * d, ":", color=f"C{h}", lw=0.8)
    ax.set_ylim(bias.min() * 1.1, 0.5)
    ax.set_xlabel("distance |i - j| (dotted: ALiBi)")
    ax.set_ylabel("bias")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle("KERPLE-log at initialisation (seed 0): -r1 log(1 + r2 d)")
    fig.tight_layout()
    from tokenpos.analysis.figures import save

    return save(fig, path, dpi)          # atomic, size- and dpi-bounded, as every other figure
