"""RoPE as forward/backward pairs: rotate x (or q and k in one pass) by per-position angles.

Shapes: B batch, H heads (q and k may differ, GQA), L length, Dh head dim, R rotary dim (even,
<= Dh; dims R..Dh-1 pass through). x (B, H, L, Dh). cos, sin: one entry per rotated pair, (L, R/2)
(every batch row at the same positions) or (B, L, R/2), already times the attention factor.

    layout "half" (HF / NeoX):      out[:R/2] = x1*cos - x2*sin,  out[R/2:R] = x2*cos + x1*sin
    layout "interleaved" (Meta):    out[2i] = x[2i]*cos_i - x[2i+1]*sin_i, out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i

The rotation is orthogonal: the backward rotates by -angle. cos/sin are cast to x's dtype (as HF
does); float32/float64 run the fused kernel when kernels are on (``_dispatch.use_kernel``). The
cache keeps cos/sin by reference: callers must treat them as immutable (build new tables rather
than writing into old ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpos.kernels.rope import rope_apply, rope_apply_backward
from tokenpos.numpy.functional._dispatch import use_kernel
from tokenpos.tables.formulas.rope import expand_to_layout, rope_rotate


@dataclass(frozen=True)
class RopeCache:
    """cos, sin ((L, R/2) or (B, L, R/2)) and the layout, for :func:`rope_backward`."""

    cos: np.ndarray
    sin: np.ndarray
    interleaved: bool


def _layout(interleaved: bool) -> str:
    return "interleaved" if interleaved else "half"


def _full(t: np.ndarray, dtype: np.dtype, interleaved: bool) -> np.ndarray:
    """(L, R/2) | (B, L, R/2) -> (L, R) | (B, 1, L, R) in ``dtype``, broadcastable against (B, H, L, R)."""
    full = expand_to_layout(t, interleaved=interleaved).astype(dtype, copy=False)
    return full[:, None] if full.ndim == 3 else full


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, sign: float) -> np.ndarray:
    """x (B, H, L, Dh) rotated by sign * angle, in x's dtype."""
    if use_kernel(x):
        c, s = (np.ascontiguousarray(t, dtype=x.dtype) for t in (cos, sin))
        run = rope_apply if sign > 0 else rope_apply_backward
        return run(x, None, c, s, layout=_layout(interleaved))[0]
    s_full = _full(sin, x.dtype, interleaved)
    return rope_rotate(x, _full(cos, x.dtype, interleaved), s_full if sign > 0 else -s_full, interleaved=interleaved)


def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool
                 ) -> tuple[np.ndarray, RopeCache]:
    """x (B, H, L, Dh) -> (rotated x (B, H, L, Dh), cache)."""
    return _rotate(x, cos, sin, interleaved, 1.0), RopeCache(cos, sin, interleaved)


def rope_backward(dout: np.ndarray, cache: RopeCache) -> np.ndarray:
    """dout (B, H, L, Dh) -> dx (B, H, L, Dh): the rotation by -angle."""
    return _rotate(dout, cache.cos, cache.sin, cache.interleaved, -1.0)


def rope_qk_forward(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool
                    ) -> tuple[np.ndarray, np.ndarray, RopeCache]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) at the same positions -> (q', k', cache); one kernel pass."""
    if use_kernel(q, k):
        c, s = (np.ascontiguousarray(t, dtype=q.dtype) for t in (cos, sin))
        q_out, k_out = rope_apply(q, k, c, s, layout=_layout(interleaved))
        return q_out, k_out, RopeCache(cos, sin, interleaved)    # type: ignore[return-value]
    cache = RopeCache(cos, sin, interleaved)
    return _rotate(q, cos, sin, interleaved, 1.0), _rotate(k, cos, sin, interleaved, 1.0), cache


def rope_qk_backward(dq: np.ndarray, dk: np.ndarray, cache: RopeCache) -> tuple[np.ndarray, np.ndarray]:
    """(dq', dk') -> (dq, dk), both rotated by -angle; one kernel pass."""
    if use_kernel(dq, dk):
        c, s = (np.ascontiguousarray(t, dtype=dq.dtype) for t in (cache.cos, cache.sin))
        gq, gk = rope_apply_backward(dq, dk, c, s, layout=_layout(cache.interleaved))
        return gq, gk    # type: ignore[return-value]
    return rope_backward(dq, cache), rope_backward(dk, cache)
