"""FIRE (Li et al., ICLR 2024): Functional Interpolation for Relative positions Encodings.

Shapes: H heads, W MLP width, Lq query length, Lk key length (query i sits at key position
``query_offset + i``, default ``Lk - Lq``).

The paper's text: ``bias[h, i, j] = f_h(psi(i - j) / psi(max(i, L)))`` with ``psi(x) = log(c x + 1)``,
f a small MLP (1 -> W, ReLU, W -> H), c and the threshold L learned. Its reference listing (the
PyTorch module in the paper's appendix) differs in details, and we follow the listing:

- ``psi(x) = log(|c * x| + 1)``: absolute values, so any sign of the learned c works;
- the threshold is ``|L_multiplier * init_L|``: ``init_L`` is a fixed constant (512 in the listing,
  the experiment passes its training length) and only the multiplier (init 1.0) is learned;
- ``eps = 1e-6`` is added to the normaliser: ``x = psi(i - j) / (psi(max(i, threshold)) + eps)``;
- c starts at 0.1, the MLP is ``nn.Linear(1, W), ReLU, nn.Linear(W, H)`` with torch's default
  init (uniform in +-1/sqrt(fan_in)), W = 32.

``torch.max(positions, threshold)`` splits the gradient equally at ties; :func:`fire_bias_backward`
does the same. Everything here is float64 NumPy; parameters are a dict of arrays:

    in_weight (W,), in_bias (W,), out_weight (W, H), out_bias (H,), c (1,), L_multiplier (1,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.tables.formulas.t5 import resolve_query_offset

FIRE_PARAMS = ("in_weight", "in_bias", "out_weight", "out_bias", "c", "L_multiplier")
FIRE_EPS = 1e-6
FIRE_INIT_C = 0.1


def fire_param_shapes(num_heads: int, width: int) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter."""
    return {"in_weight": (width,), "in_bias": (width,), "out_weight": (width, num_heads), "out_bias": (num_heads,),
            "c": (1,), "L_multiplier": (1,)}


def fire_init(num_heads: int, width: int, rng: np.random.Generator, *,
              init_c: float = FIRE_INIT_C) -> dict[str, np.ndarray]:
    """Initial parameters (float64): torch's ``nn.Linear`` default bounds, c = init_c, multiplier 1."""
    bound_out = 1.0 / np.sqrt(width)
    return {
        "in_weight": rng.uniform(-1.0, 1.0, width),            # fan_in 1: bound 1
        "in_bias": rng.uniform(-1.0, 1.0, width),
        "out_weight": rng.uniform(-bound_out, bound_out, (width, num_heads)),
        "out_bias": rng.uniform(-bound_out, bound_out, num_heads),
        "c": np.array([init_c], dtype=np.float64),
        "L_multiplier": np.array([1.0], dtype=np.float64),
    }


def fire_positions(q_len: int, k_len: int, query_offset: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(query positions (Lq,), relative distances q_pos - k_pos (Lq, Lk)), float64."""
    offset = resolve_query_offset(q_len, k_len, query_offset)
    q_pos = np.arange(q_len, dtype=np.float64) + offset
    return q_pos, q_pos[:, None] - np.arange(k_len, dtype=np.float64)[None, :]


@dataclass
class FireCache:
    """What the backward needs from the forward (all float64)."""

    q_pos: np.ndarray      # (Lq,)
    rel: np.ndarray        # (Lq, Lk)
    u: np.ndarray          # (Lq, Lk) psi(rel)
    v: np.ndarray          # (Lq,) psi(normaliser) + eps
    norm: np.ndarray       # (Lq,) max(q_pos, threshold)
    threshold: float
    x: np.ndarray          # (Lq, Lk) u / v
    z: np.ndarray          # (Lq, Lk, W) pre-activation
    h: np.ndarray          # (Lq, Lk, W) ReLU(z)


def fire_bias(params: dict[str, Any], q_len: int, k_len: int, *, init_L: float, query_offset: int | None = None,
              eps: float = FIRE_EPS) -> tuple[np.ndarray, FireCache]:
    """The bias (H, Lq, Lk) and the cache for :func:`fire_bias_backward`."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    c, mult = float(p["c"][0]), float(p["L_multiplier"][0])
    q_pos, rel = fire_positions(q_len, k_len, query_offset)
    threshold = abs(mult * init_L)
    norm = np.maximum(q_pos, threshold)                                     # (Lq,)
    u = np.log(np.abs(c * rel) + 1.0)                                       # (Lq, Lk)
    v = np.log(np.abs(c * norm) + 1.0) + eps                                # (Lq,)
    x = u / v[:, None]                                                      # (Lq, Lk)
    z = x[..., None] * p["in_weight"] + p["in_bias"]                        # (Lq, Lk, W)
    h = np.maximum(z, 0.0)
    out = h @ p["out_weight"] + p["out_bias"]                               # (Lq, Lk, H)
    cache = FireCache(q_pos, rel, u, v, norm, threshold, x, z, h)
    return np.moveaxis(out, -1, 0), cache


def fire_bias_backward(grad_bias: np.ndarray, params: dict[str, Any], cache: FireCache, *,
                       init_L: float) -> dict[str, np.ndarray]:
    """Gradients of :func:`fire_bias` w.r.t. every parameter from grad (H, Lq, Lk), float64."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    c, mult = float(p["c"][0]), float(p["L_multiplier"][0])
    g = np.moveaxis(np.asarray(grad_bias, dtype=np.float64), 0, -1)        # (Lq, Lk, H)
    grads = {"out_bias": g.sum(axis=(0, 1)),
             "out_weight": np.einsum("qkw,qkh->wh", cache.h, g)}
    dz = (g @ p["out_weight"].T) * (cache.z > 0)                            # (Lq, Lk, W)
    grads["in_bias"] = dz.sum(axis=(0, 1))
    grads["in_weight"] = np.einsum("qkw,qk->w", dz, cache.x)
    dx = dz @ p["in_weight"]                                                # (Lq, Lk)
    du = dx / cache.v[:, None]                                              # (Lq, Lk)
    dv = -(dx * cache.u).sum(axis=1) / cache.v ** 2                         # (Lq,)
    sc = np.sign(c)
    abs_rel, abs_norm = np.abs(cache.rel), np.abs(cache.norm)
    dc = (du * sc * abs_rel / (np.abs(c) * abs_rel + 1.0)).sum()
    dc += (dv * sc * abs_norm / (np.abs(c) * abs_norm + 1.0)).sum()
    grads["c"] = np.array([dc])
    d_norm = dv * abs(c) * np.sign(cache.norm) / (np.abs(c * cache.norm) + 1.0)   # (Lq,)
    share = (cache.threshold > cache.q_pos) + 0.5 * (cache.threshold == cache.q_pos)
    d_threshold = float((d_norm * share).sum())
    grads["L_multiplier"] = np.array([d_threshold * np.sign(mult * init_L) * init_L])
    return grads
