"""Plots of the schemes that act inside attention: RoPE (and its scalings), ALiBi, T5 buckets.

Same conventions as plots.py: ``plot_<kind>(path, **opts) -> Path``, Agg figures (figures.py), titled,
labelled, colour bars on heatmaps, numbers from ``tokenpos.tables`` only.
Shapes: H heads, L length, Dh head dim, F = Dh / 2 frequency pairs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from tokenpos.analysis.figures import check_head_dim, check_size, new_figure, save
from tokenpos.tables.checks.validation import check_float

# ---------------------------------------------------------------------------------------------- rope


def rope_scalings(original_max: int, factor: float) -> dict[str, dict[str, Any] | None]:
    """The HF scaling configs compared in the rope plot (all extend ``original_max`` by ``factor``)."""
    return {
        "default (no scaling)": None,
        f"linear x{factor:g}": {"rope_type": "linear", "factor": factor},
        f"dynamic NTK x{factor:g} (at {int(factor * original_max):,} tokens)": {"rope_type": "dynamic",
                                                                               "factor": factor},
        f"yarn x{factor:g}": {"rope_type": "yarn", "factor": factor,
                              "original_max_position_embeddings": original_max},
        f"llama3 x{factor:g}": {"rope_type": "llama3", "factor": factor,
                                "original_max_position_embeddings": original_max,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    }


def rope_wavelengths(*, head_dim: int = 128, base: float = 10000.0, original_max: int = 4096,
                     factor: float = 4.0) -> dict[str, tuple[np.ndarray, float]]:
    """``{label: (wavelength per pair (F,), attention_factor)}``; wavelength = 2 pi / inv_freq, in positions."""
    from tokenpos.tables.formulas.rope import rope_inv_freq

    out = {}
    for label, scaling in rope_scalings(original_max, factor).items():
        inv_freq, att = rope_inv_freq(
            head_dim, base=base, scaling=scaling, max_position_embeddings=original_max,
            seq_len=int(factor * original_max))
        out[label] = (2 * math.pi / inv_freq, att)                                   # (F,)
    return out


def plot_rope(path: str | Path, *, head_dim: int = 128, base: float = 10000.0, original_max: int = 4096,
              factor: float = 4.0, dpi: int = 110) -> Path:
    """Two panels: the wavelength of each rotary pair per scaling; its ratio to the unscaled wavelength."""
    check_head_dim(head_dim, minimum=4)                  # dynamic NTK, one of the scalings drawn, needs R > 2
    check_size("original_max", original_max)
    check_float("factor", factor, low=0.0, high=1e6, low_inclusive=False)
    waves = rope_wavelengths(head_dim=head_dim, base=base, original_max=original_max, factor=factor)
    default = next(iter(waves.values()))[0]
    fig = new_figure(8.5, 7.5)
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    styles = ["-", "--", "-.", "-", ":"]
    for (label, (wave, att)), ls in zip(waves.items(), styles, strict=False):
        name = label + (f", attention factor {att:.3f}" if att != 1.0 else "")
        pairs = np.arange(wave.shape[0])
        top.plot(pairs, wave, ls, label=name, linewidth=1.5)
        bottom.plot(pairs, wave / default, ls, linewidth=1.5)
    for length, text in ((original_max, "trained context"), (factor * original_max, "extended context")):
        top.axhline(length, color="0.4", linewidth=0.8, linestyle=":")
        top.text(0, length * 1.15, f"{text} {int(length):,}", fontsize=8, color="0.3")
    top.set_yscale("log")
    top.set_title(f"RoPE wavelength per dimension pair (head_dim={head_dim}, base={base:g}) and its scalings")
    top.set_ylabel("wavelength 2π/θ_i (positions)")
    top.set_xlabel("dimension pair i")
    top.legend(fontsize=8, loc="lower right")
    bottom.axhline(1.0, color="0.6", linewidth=0.8)
    bottom.set_xlabel("dimension pair i (0 = highest frequency)")
    bottom.set_ylabel("scaled / default wavelength")
    bottom.set_title("Effect of each scaling: 1 = unchanged (extrapolated), factor = interpolated", fontsize=10)
    return save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- alibi


def plot_alibi(path: str | Path, *, num_heads: int = 8, seq_len: int = 24, dpi: int = 110) -> Path:
    """One heatmap per head of the causal ALiBi bias ``-m_h |i - j|`` (keys after the query masked)."""
    from tokenpos.tables.formulas.alibi import alibi_bias, alibi_slopes

    H = check_size("num_heads", num_heads)
    L = check_size("seq_len", seq_len, "alibi_seq_len")
    bias = alibi_bias(H, L, L)                                                      # (H, L, L)
    slopes = alibi_slopes(H)                                                        # (H,)
    causal = np.tril(np.ones((L, L), dtype=bool))                                   # (L, L)
    ncols = min(4, H)
    nrows = math.ceil(H / ncols)
    fig = new_figure(3.1 * ncols, 2.8 * nrows + 0.6)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for h, ax in enumerate(axes):
        if h >= H:
            ax.set_visible(False)
            continue
        im = ax.imshow(np.where(causal, bias[h], np.nan), cmap="magma", interpolation="nearest")
        ax.set_title(f"head {h}: slope {slopes[h]:.4g}", fontsize=9)
        ax.set_xlabel("key position j", fontsize=8)
        ax.set_ylabel("query position i", fontsize=8)
        ax.tick_params(labelsize=7)
        fig.colorbar(im, ax=ax, shrink=0.85).ax.tick_params(labelsize=7)
    fig.suptitle(f"ALiBi attention bias -slope_h * |i - j| per head (H={H}, causal, L={L}); "
                 "blank = masked future keys", fontsize=11)
    return save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- t5


def plot_t5(path: str | Path, *, seq_len: int = 256, num_buckets: int = 32, max_distance: int = 128,
            dpi: int = 110) -> Path:
    """Left: the bidirectional bucket of each (query, key) pair. Right: bucket against relative position."""
    from tokenpos.tables.formulas.t5 import t5_bucket_matrix, t5_relative_bucket

    L = check_size("seq_len", seq_len, "t5_seq_len")
    check_size("num_buckets", num_buckets)
    check_size("max_distance", max_distance)
    buckets = t5_bucket_matrix(L, L, num_buckets=num_buckets, max_distance=max_distance)   # (L, L)
    fig = new_figure(12.0, 5.0)
    left, right = fig.subplots(1, 2, width_ratios=[1.1, 1])
    im = left.imshow(buckets, cmap="viridis", interpolation="nearest")
    left.set_title(f"T5 bucket map (bidirectional, {num_buckets} buckets, max_distance {max_distance})",
                   fontsize=10)
    left.set_xlabel("key position j")
    left.set_ylabel("query position i")
    fig.colorbar(im, ax=left, label="bucket (one learned bias per bucket and head)")
    span = int(1.5 * max_distance)
    rel = np.arange(-span, span + 1)                                                # (2S+1,)
    for bidirectional, label in ((True, "bidirectional (encoder)"), (False, "causal (decoder)")):
        b = t5_relative_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        right.step(rel, b, where="mid", label=label, linewidth=1.4)
    for x in (-max_distance, max_distance):
        right.axvline(x, color="0.5", linestyle=":", linewidth=0.9)
    right.text(max_distance, 1, " max_distance:\n all farther\n keys share\n the last bucket", fontsize=8, color="0.3")
    right.set_title("Bucket against relative position (exact near, logarithmic far)", fontsize=10)
    right.set_xlabel("relative position j - i")
    right.set_ylabel("bucket")
    right.legend(fontsize=8, loc="center right")
    return save(fig, path, dpi)
