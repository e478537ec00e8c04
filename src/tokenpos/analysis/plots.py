"""Plots of the positional schemes and of embedding memory: ``plot_<kind>(path, **opts) -> Path``.

Every figure is a ``matplotlib.figure.Figure`` drawn on an Agg canvas (never pyplot's global state),
titled, with labelled axes and a colour bar on every heatmap. Every number comes from
``tokenpos.tables`` (formulas) or ``tokenpos.analysis.memory`` (arithmetic); nothing is re-derived.

Shapes: P positions, D model dim, H heads, Dh head dim, F = Dh / 2 rotary frequencies.
This module holds the additive-scheme and memory plots and the registry ``PLOTS`` of every kind; rope /
alibi / t5 live in plots_relative.py, M-RoPE and 2-D positions in plots_rope.py.

The canvas, the size bounds and the atomic output live in figures.py (re-exported here for the existing
imports). Imports go one way: plots -> plots_relative, plots_rope -> figures; nothing imports plots back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tokenpos.analysis import plots_relative, plots_rope
from tokenpos.analysis.figures import (
    FORMATS,
    LIMITS,
    MAX_DPI,
    MAX_PIXELS,
    check_head_dim,
    check_size,
    new_figure,
    output_path,
    save,
)
from tokenpos.tables.checks.validation import check_choice, check_int, check_positive_int

# ---------------------------------------------------------------------------------------------- sinusoidal


def plot_sinusoidal(path: str | Path, *, num_positions: int = 256, d_model: int = 128, base: float = 10000.0,
                    layout: str = "interleaved", dpi: int = 110) -> Path:
    """Heatmap of the sinusoidal table: position (rows) x dimension (columns)."""
    from tokenpos.tables import sinusoidal_table

    check_size("num_positions", num_positions)
    check_size("d_model", d_model)
    check_int("num_positions * d_model", num_positions * d_model, maximum=LIMITS["table_cells"])
    pe = sinusoidal_table(num_positions, d_model, base=base, layout=layout)          # (P, D)
    fig = new_figure(8.0, 5.5)
    ax = fig.add_subplot()
    im = ax.imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest", origin="upper")
    ax.set_title(f"Sinusoidal position encoding (d_model={d_model}, base={base:g}, {layout} sin/cos)")
    ax.set_xlabel("embedding dimension")
    ax.set_ylabel("position")
    fig.colorbar(im, ax=ax, label="PE[position, dimension]")
    return save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- similarity


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows: (..., D), (..., D) -> (...)."""
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def similarity_curves(*, max_distance: int = 256, d_model: int = 128, head_dim: int = 64,
                      rope_factor: float = 4.0, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Similarity between the encodings of positions m and m + k, against the distance k.

    - sinusoidal: cos(PE[0], PE[k]) (it depends on k only).
    - RoPE: cos(R_0 x, R_k x) for one fixed random vector x of size Dh (the query/key score of the same
      content at distance k, relative to k = 0); also with linear scaling by ``rope_factor``.
    - learned (random init, N(0, 0.02), untrained): the mean over m of cos(E[m], E[m + k]).

    Returns:
        ``(distances (K,), {label: (K,)})`` with K = max_distance + 1.
    """
    from tokenpos.tables import init_weight, sinusoidal_table
    from tokenpos.tables.formulas.rope import rope_cos_sin, rope_inv_freq, rope_rotate

    K = check_positive_int("max_distance", max_distance) + 1
    k = np.arange(K)                                                                  # (K,)
    rng = np.random.default_rng(seed)
    pe = sinusoidal_table(K, d_model)                                                 # (K, D)
    curves = {f"sinusoidal (d_model={d_model})": _cosine(pe[:1], pe)}
    x = rng.standard_normal(head_dim)                                                 # (Dh,)
    for label, scaling in ((f"RoPE (head_dim={head_dim})", None),
                           (f"RoPE, linear scaling x{rope_factor:g}", {"rope_type": "linear", "factor": rope_factor})):
        inv_freq, att = rope_inv_freq(head_dim, scaling=scaling)                      # (F,)
        cos, sin = rope_cos_sin(k, inv_freq, attention_factor=att)                    # (K, Dh)
        rotated = rope_rotate(np.broadcast_to(x, (K, head_dim)), cos, sin)            # (K, Dh)
        curves[label] = _cosine(rotated[:1], rotated)
    table = init_weight((2 * K, d_model), "normal", std=0.02, rng=rng)               # (2K, D)
    m = np.arange(K)
    curves["learned (random init, untrained)"] = np.array([_cosine(table[m], table[m + d]).mean() for d in k])
    return k, curves


def plot_similarity(path: str | Path, *, max_distance: int = 256, d_model: int = 128, head_dim: int = 64,
                    seed: int = 0, dpi: int = 110) -> Path:
    """Line plot: similarity of two position encodings against their distance (see similarity_curves)."""
    check_size("max_distance", max_distance)
    check_size("d_model", d_model)
    check_head_dim(head_dim)
    check_int("max_distance * d_model", max_distance * d_model, maximum=LIMITS["table_cells"])
    k, curves = similarity_curves(max_distance=max_distance, d_model=d_model, head_dim=head_dim, seed=seed)
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot()
    styles = ["-", "-", "--", ":"]
    for (label, y), ls in zip(curves.items(), styles, strict=False):
        ax.plot(k, y, ls, label=label, linewidth=1.6)
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_title("Similarity of position encodings against distance")
    ax.set_xlabel("distance k = |m - n| (positions)")
    ax.set_ylabel("cosine similarity")
    ax.set_xlim(0, k[-1])
    ax.legend(loc="upper right", fontsize=9)
    ax.text(0.01, 0.02, f"learned: tables.init_weight N(0, 0.02), seed {seed}, never trained; "
            "RoPE: one random vector rotated to positions 0 and k",
            transform=ax.transAxes, fontsize=7.5, color="0.35")
    return save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- memory


def plot_memory(path: str | Path, *, precision: str = "fp32", dpi: int = 110) -> Path:
    """Heatmap of the token table's size over vocab size x d_model (log axes), with the presets marked."""
    from matplotlib.colors import LogNorm

    from tokenpos.analysis.memory import MIB, PRECISIONS, PRESETS, SEED_SCENARIOS, memory_grid

    vocab = np.unique(np.geomspace(1_000, 262_144, 64).astype(int))                  # (nV,)
    dims = np.unique(np.geomspace(64, 16_384, 48).astype(int))                       # (nD,)
    grid = np.array(memory_grid(vocab, dims, precision))                              # (nD, nV) MiB
    fig = new_figure(8.5, 5.8)
    ax = fig.add_subplot()
    mesh = ax.pcolormesh(vocab, dims, grid, norm=LogNorm(vmin=grid.min(), vmax=grid.max()), cmap="viridis",
                         shading="nearest")
    levels = [1, 10, 100, 1024, 10 * 1024]
    cs = ax.contour(vocab, dims, grid, levels=levels, colors="white", linewidths=0.7)
    spots = []                          # label each contour at the (log) middle of its visible segment
    for lv in levels:
        params = lv * MIB / PRECISIONS[precision]                                   # V * D on this contour
        lo, hi = max(vocab[0], params / dims[-1]), min(vocab[-1], params / dims[0])
        v = float(np.sqrt(lo * hi))
        spots.append((v, params / v))
    labels = ax.clabel(cs, fmt={lv: (f"{lv / 1024:g} GiB" if lv >= 1024 else f"{lv:g} MiB") for lv in levels},
                       fontsize=7, inline=False, manual=spots)
    for text in labels:
        text.set_bbox({"facecolor": "black", "alpha": 0.45, "edgecolor": "none", "pad": 1.5})
    marked = {(c.vocab_size, c.d_model) for c in PRESETS.values()}
    extra = [c for c in SEED_SCENARIOS if (c.vocab_size, c.d_model) not in marked]  # GPT-3 scale = gpt3-175b
    for cfg in list(PRESETS.values()) + extra:
        ax.plot(cfg.vocab_size, cfg.d_model, "o", color="tab:red", markersize=5)
        ax.annotate(cfg.name, (cfg.vocab_size, cfg.d_model), textcoords="offset points", xytext=(5, 4),
                    fontsize=7.5, color="white")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"Token embedding table size ({precision}, V x D parameters)")
    ax.set_xlabel("vocab size V")
    ax.set_ylabel("d_model D")
    fig.colorbar(mesh, ax=ax, label=f"{precision} size (MiB = 2^20 bytes)")
    return save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- registry


PLOTS: dict[str, Callable[..., Path]] = {
    "sinusoidal": plot_sinusoidal,
    "similarity": plot_similarity,
    "rope": plots_relative.plot_rope,
    "alibi": plots_relative.plot_alibi,
    "t5": plots_relative.plot_t5,
    "memory": plot_memory,
    "mrope": plots_rope.plot_mrope,
    "positions2d": plots_rope.plot_positions_2d,
}
DESCRIPTIONS: dict[str, str] = {
    "sinusoidal": "heatmap of the sinusoidal table, position x dimension",
    "similarity": "similarity of two position encodings against distance (sinusoidal, RoPE, learned)",
    "rope": "RoPE wavelength per dimension pair, and the effect of each scaling",
    "alibi": "ALiBi bias matrices, one per head",
    "t5": "T5 relative-position bucket map",
    "memory": "token-table memory against vocab size and d_model",
    "mrope": "M-RoPE: the axis each frequency reads (Qwen2-VL / Qwen3-VL) and the ids of text + image",
    "positions2d": "2-D patch positions: axial 2-D RoPE similarity and the 2-D sin-cos table",
}


def plot(kind: str, path: str | Path, **opts: Any) -> Path:
    """Draw the plot ``kind`` (one of PLOTS) to ``path``; ConfigError for an unknown kind."""
    return PLOTS[check_choice("plot kind", kind, PLOTS)](path, **opts)


__all__ = ["DESCRIPTIONS", "FORMATS", "LIMITS", "MAX_DPI", "MAX_PIXELS", "PLOTS", "check_size", "new_figure",
           "output_path", "plot", "plot_memory", "plot_similarity", "plot_sinusoidal", "save", "similarity_curves"]
