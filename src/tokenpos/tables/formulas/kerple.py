"""KERPLE, the logarithmic variant (Chi et al., NeurIPS 2022): a learned distance-kernel attention bias.

Shapes: H heads, Lq query length, Lk key length (query i sits at key position ``query_offset + i``,
default ``Lk - Lq``, HF's ``past_seen_tokens``).

    bias[h, i, j] = -r1[h] * log(1 + r2[h] * |q_pos(i) - j|),     r1, r2 > 0 learned per head

The paper's text asks for r1, r2 > 0. Its reference code (``KerpleLog`` in the authors' GPT-NeoX
fork, parameters ``bias_p`` = r1 and ``bias_a`` = r2) keeps them positive by *projecting*: before
every forward the parameters are clamped in place to at least ``eps = 1e-2``; the gradient then
flows through r1 and r2 themselves (no softplus or exp reparameterisation). Initialisation in that
code: ``r1 = 2 * U(0, 1)``, ``r2 = U(0, 1)``, one value per head. We follow the code in all three
points. Everything here is float64 NumPy; the check of eps is ``tables.checks.bias.check_kerple_eps``.
"""

from __future__ import annotations

import numpy as np

from tokenpos.tables.formulas.t5 import t5_relative_positions

KERPLE_EPS = 1e-2          # the reference code's clamp floor for r1 and r2


def kerple_init(num_heads: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The reference code's initial (r1, r2): ``2 * U(0, 1)`` and ``U(0, 1)``, each (H,) float64."""
    r1 = 2.0 * rng.random(num_heads)
    r2 = rng.random(num_heads)
    return r1, r2


def kerple_distance(q_len: int, k_len: int, query_offset: int | None = None) -> np.ndarray:
    """``|q_pos(i) - j|`` as float64 (Lq, Lk)."""
    return np.abs(t5_relative_positions(q_len, k_len, query_offset)).astype(np.float64)


def kerple_project(r: np.ndarray, eps: float = KERPLE_EPS) -> np.ndarray:
    """The reference code's projection: ``max(r, eps)`` (callers write it back into the parameter)."""
    return np.maximum(np.asarray(r), eps)


def kerple_bias(r1: np.ndarray, r2: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """``-r1[h] * log1p(r2[h] * d)``: r1, r2 (H,), distance (Lq, Lk) -> (H, Lq, Lk).

    r1 and r2 are used as given (already projected); see :func:`kerple_project`.
    """
    r1, r2, d = np.asarray(r1), np.asarray(r2), np.asarray(distance)
    return -r1[:, None, None] * np.log1p(r2[:, None, None] * d[None])


def kerple_bias_backward(grad_bias: np.ndarray, r1: np.ndarray, r2: np.ndarray,
                         distance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`kerple_bias` w.r.t. (r1, r2) from grad (H, Lq, Lk): two (H,) arrays.

    d bias / d r1 = -log1p(r2 d);  d bias / d r2 = -r1 d / (1 + r2 d).
    """
    g = np.asarray(grad_bias)
    r1, r2, d = np.asarray(r1), np.asarray(r2), np.asarray(distance)[None]
    rd = r2[:, None, None] * d                                               # (H, Lq, Lk)
    d_r1 = -(g * np.log1p(rd)).sum(axis=(1, 2))
    d_r2 = -(g * r1[:, None, None] * d / (1.0 + rd)).sum(axis=(1, 2))
    return d_r1, d_r2
