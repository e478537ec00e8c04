"""Sinusoidal position encodings (Vaswani et al. 2017), computed in float64.

Layouts (P positions, D = d_model, F = ceil(D / 2) frequencies):

- ``"interleaved"`` (Vaswani, tensor2tensor's "interleave"): ``PE[p, 2i] = sin(p * w_i)``,
  ``PE[p, 2i+1] = cos(p * w_i)`` with ``w_i = base ** (-2i / D)``.
- ``"half"`` (HF Marian / fairseq-style concatenation): ``PE[p, :F] = sin(p * w)``,
  ``PE[p, F:] = cos(p * w[:D - F])``.

Odd ``D`` works in both: the sine part gets ``ceil(D/2)`` columns, the cosine part ``floor(D/2)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_choice, check_float, check_int, check_positions

LAYOUTS = ("interleaved", "half")


def sinusoidal_inv_freq(d_model: int, *, base: float = 10000.0) -> np.ndarray:
    """Angular frequencies ``w_i = base ** (-2i / d_model)`` for i in [0, ceil(D/2)); shape (F,), float64."""
    d_model = check_int("d_model", d_model, minimum=1)
    base = check_float("base", base, low=1.0, low_inclusive=False)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)
    return np.power(base, -two_i / d_model)


def sinusoidal_encoding(positions: Any, d_model: int, *, base: float = 10000.0,
                        layout: str = "interleaved") -> np.ndarray:
    """Encodings of arbitrary non-negative integer positions.

    Args:
        positions: integer array of shape (...).
        d_model: D, any positive integer (odd works).
        base: the wavelength base (10000 in the paper).
        layout: "interleaved" or "half".

    Returns:
        float64 array of shape (..., D).
    """
    check_choice("layout", layout, LAYOUTS)
    pos = check_positions(positions).astype(np.float64)
    inv_freq = sinusoidal_inv_freq(d_model, base=base)           # (F,)
    angles = pos[..., None] * inv_freq                           # (..., F)
    n_sin = inv_freq.shape[0]                                    # ceil(D/2)
    n_cos = d_model - n_sin                                      # floor(D/2)
    out = np.empty(pos.shape + (d_model,), dtype=np.float64)     # (..., D)
    if layout == "interleaved":
        out[..., 0::2] = np.sin(angles)
        out[..., 1::2] = np.cos(angles[..., :n_cos])
    else:
        out[..., :n_sin] = np.sin(angles)
        out[..., n_sin:] = np.cos(angles[..., :n_cos])
    return out


def sinusoidal_table(num_positions: int, d_model: int, *, base: float = 10000.0,
                     layout: str = "interleaved") -> np.ndarray:
    """The table for positions 0..num_positions-1; shape (P, D), float64.

    Row 0 is ``[0, 1, 0, 1, ...]`` in the interleaved layout.
    """
    num_positions = check_int("num_positions", num_positions, minimum=0)
    return sinusoidal_encoding(np.arange(num_positions, dtype=np.int64), d_model, base=base, layout=layout)
