"""2-D position encodings for image patches: axial 2-D RoPE (Pixtral) and the 2-D sin-cos table (MAE / ViT-MAE).

Shapes: N patches (row-major over an (H, W) grid), Dh head dim, F = Dh / 2 rotated pairs, D model dim.

2-D RoPE (HF ``PixtralVisionRotaryEmbedding``): the default frequencies ``inv = base ** (-2i / Dh)`` are
re-ordered ``cat(inv[0::2], inv[1::2])``; pairs [0, F/2) rotate by ``row * inv[0::2]`` and pairs
[F/2, F) by ``col * inv[1::2]``, half layout over the whole head. This is the M-RoPE machinery with
two axes: ``axis_of_freq = [0] * F/2 + [1] * F/2`` over positions (2, ..., N).

2-D sin-cos (HF ``build_2d_sinusoidal_position_embedding``, ViT-MAE): ``[sin(h w) | cos(h w) | sin(c w) |
cos(c w)]`` with ``w = base ** (-arange(D/4) / (D/4))`` for row h and column c; optional zero CLS row.

The 2-D RoPE layers' input checks are in ``tables.checks.rotary_layers``; reading a Pixtral config is
``tables.hf.models.rope2d_args_from_hf_config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_float, check_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import rope_inv_freq


def rope2d_inv_freq(head_dim: int, *, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """``(inv_freq (F,), axis_of_freq (F,))`` of axial 2-D RoPE (row axis 0, column axis 1), float64 / int64."""
    head_dim = check_int("head_dim", head_dim, minimum=4)
    if head_dim % 4:
        raise ConfigError(f"2-D RoPE needs head_dim divisible by 4 (F/2 pairs per axis), got {head_dim}")
    inv, _ = rope_inv_freq(head_dim, base=base)
    f = head_dim // 2
    return np.concatenate([inv[0::2], inv[1::2]]), np.repeat(np.arange(2, dtype=np.int64), f // 2)


def rope2d_layer_args(head_dim: Any, base: Any) -> tuple[int, float, np.ndarray, np.ndarray]:
    """``(head_dim, base, inv_freq (F,) float64, axis_of_freq (F,) int64)`` of a 2-D RoPE layer, checked."""
    head_dim, base = check_int("head_dim", head_dim, minimum=4), check_float("base", base, low=1.0)
    inv_freq, axis_map = rope2d_inv_freq(head_dim, base=base)           # checks head_dim % 4
    return head_dim, base, inv_freq, axis_map


def patch_positions_2d(grid_sizes: Any) -> np.ndarray:
    """(row, col) of every patch of images with (H, W) patch grids, row-major, concatenated: (N, 2) int64."""
    out = []
    for hw in grid_sizes:
        h, w = (check_int("grid size", v, minimum=1) for v in hw)
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        out.append(np.stack([rows.ravel(), cols.ravel()], axis=-1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 2), dtype=np.int64)


def sincos_2d_table(height: int, width: int, d_model: int, *, base: float = 10000.0,
                    cls_token: bool = False) -> np.ndarray:
    """The 2-D sin-cos table ``(H * W [+ 1], D)`` in float64, rows row-major (HF / ViT-MAE layout)."""
    height, width = check_int("height", height, minimum=1), check_int("width", width, minimum=1)
    d_model = check_int("d_model", d_model, minimum=4)
    if d_model % 4:
        raise ConfigError(f"the 2-D sin-cos table needs d_model divisible by 4, got {d_model}")
    base = check_float("base", base, low=1.0, low_inclusive=False)
    q = d_model // 4
    omega = 1.0 / base ** (np.arange(q, dtype=np.float64) / q)                    # (D/4,)
    rows, cols = np.meshgrid(np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64), indexing="ij")
    eh, ew = np.outer(rows.ravel(), omega), np.outer(cols.ravel(), omega)          # (H*W, D/4)
    table = np.concatenate([np.sin(eh), np.cos(eh), np.sin(ew), np.cos(ew)], axis=1)
    return np.concatenate([np.zeros((1, d_model)), table]) if cls_token else table
