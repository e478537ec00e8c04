"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE with a per-pair decay scale.

Shapes: L length, R rotary dim, F = R / 2 pairs, ``...`` any leading.

Pair j gets ``zeta_j = (2j + 0.4 R) / (1.4 R)`` and, at position n, the scale
``s_j(n) = zeta_j ** ((n - c) / scale_base)`` (c a centre; rotary-embedding-torch uses L // 2 of the
call). q is rotated and multiplied by s, k rotated and divided by s, so the score of (m, n) carries
``zeta_j ** ((m - n) / scale_base)``: a decay with distance that does not depend on c.

So xPos is the RoPE rotation fed with per-tensor scaled tables: ``(cos * s, sin * s)`` for q and
``(cos / s, sin / s)`` for k. The map stays ``scale * rotation``; its transpose (the backward) is
the same scaled tables with ``-sin``, exactly as for RoPE. Precision: s is computed in float64; far
from c it under/overflows (zeta_0 ** (+-n / scale_base)), a property of xPos itself. The layers' checks
and messages are in ``tables.checks.rotary_layers``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_float, check_positions


def xpos_zeta(rotary_dim: int) -> np.ndarray:
    """``(2j + 0.4 R) / (1.4 R)`` for j in [0, F): shape (F,), float64."""
    return (np.arange(0, rotary_dim, 2, dtype=np.float64) + 0.4 * rotary_dim) / (1.4 * rotary_dim)


def xpos_center(center: float | None, length: int) -> float | int:
    """The position where the scale is 1: ``center``, or ``L // 2`` of the call when None (rotary-embedding-torch)."""
    return length // 2 if center is None else center


def xpos_scale_of(zeta: Any, positions: Any, *, scale_base: float, center: Any) -> Any:
    """The xPos scale formula, written once for NumPy arrays and torch tensors alike (operators only).

    ``zeta ** ((positions - center) / scale_base)``: zeta (F,) and float positions (...) of one array
    type (float64; float32 on MPS), ``center`` a number or one per position (...) -> (..., F). No
    checks (see :func:`xpos_scale`).
    """
    return zeta ** ((positions - center)[..., None] / scale_base)


def xpos_document_centres(positions: np.ndarray) -> np.ndarray:
    """The default centre of every token of a packed row: its document's ``L // 2``, the centre the
    document would get run alone. positions (T,) int, restarting at 0 in every document -> (T,) int64."""
    starts = np.flatnonzero(positions == 0)
    lengths = np.diff(np.append(starts, positions.size))
    return np.repeat(lengths // 2, lengths)


def xpos_scale(positions: Any, rotary_dim: int, *, scale_base: float = 512.0, center: Any = 0.0) -> np.ndarray:
    """Per-pair scales of q at int positions (...): ``zeta ** ((pos - center) / scale_base)`` -> (..., F) float64;
    ``center`` a number or one per position (...).

    k uses the reciprocal.
    """
    scale_base = check_float("scale_base", scale_base, low=0.0, low_inclusive=False)
    pos = check_positions(positions).astype(np.float64)
    return xpos_scale_of(xpos_zeta(rotary_dim), pos, scale_base=scale_base,  # type: ignore[no-any-return]
                         center=np.asarray(center, dtype=np.float64))


def xpos_scaled_tables(cos: Any, sin: Any, scale: Any) -> tuple[Any, Any, Any, Any]:
    """``(cos_q, sin_q, cos_k, sin_k) = (cos * s, sin * s, cos / s, sin / s)``: the per-tensor tables of q and k
    (NumPy arrays or torch tensors, (..., F))."""
    return cos * scale, sin * scale, cos / scale, sin / scale
