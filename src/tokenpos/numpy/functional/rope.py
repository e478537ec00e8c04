"""RoPE as forward/backward pairs: rotate x (or q and k in one pass) by per-position angles.

Shapes: B batch, H heads (q and k may differ, GQA), L length, Dh head dim, R rotary dim (even,
<= Dh; dims R..Dh-1 pass through), P table rows. x (B, H, L, Dh). cos, sin: one entry per rotated pair,
(L, R/2) (every batch row at the same positions) or (B, L, R/2), already times the attention factor;
or, with ``positions`` (L,) / (1, L) / (B, L) integers in [0, P), one (P, R/2) table (a cached table
read by position: packed documents) whose row ``positions[b, l]`` rotates token (b, l), in the same
kernel pass (no gathered per-call tables).

    layout "half" (HF / NeoX):      out[:R/2] = x1*cos - x2*sin,  out[R/2:R] = x2*cos + x1*sin
    layout "interleaved" (Meta):    out[2i] = x[2i]*cos_i - x[2i+1]*sin_i, out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i

The rotation is orthogonal: the backward rotates by -angle. cos/sin are cast to x's dtype (as HF
does); float32/float64 run the fused kernel when kernels are on (``_dispatch.use_kernel``). The
cache keeps cos/sin (and positions) by reference: callers must treat them as immutable (build new
tables rather than writing into old ones).

Each kernel pass is this module's :func:`rope_apply` / :func:`rope_apply_backward` (the kernel API's names,
arguments and results): arrays already in shape, as the layers' default calls give them, go straight to the
compiled pass (``kernels.rope.run_rope``); the rest through the checked kernel API, which validates and copies.

Tables read by position run the kernel in the inputs' memory order: a (B, H, L, Dh) view of a
(B, L, H, Dh) array (``qk_layout="blhd"``, a packed ``"thd"`` row) is rotated as its (B * L, H, 1, Dh)
view with positions (B * L, 1), so it is not copied first, and the result comes back in that layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos._config import OUTPUTS
from tokenpos.kernels import rope as kernel
from tokenpos.kernels.rope import run_rope
from tokenpos.numpy.functional._dispatch import KERNEL_DTYPES, use_kernel
from tokenpos.tables.formulas.rope import expand_to_layout, rope_rotate


@dataclass(frozen=True)
class RopeCache:
    """cos, sin ((L, R/2) or (B, L, R/2); (P, R/2) with positions), the layout and the positions
    (None, or (L,) / (1, L) / (B, L)), for :func:`rope_backward`."""

    cos: np.ndarray
    sin: np.ndarray
    interleaved: bool
    positions: np.ndarray | None = None


def _full(t: np.ndarray, dtype: np.dtype, interleaved: bool) -> np.ndarray:
    """(L, R/2) | (B, L, R/2) -> (L, R) | (B, 1, L, R) in ``dtype``, broadcastable against (B, H, L, R)."""
    full = expand_to_layout(t, interleaved=interleaved).astype(dtype, copy=False)
    return full[:, None] if full.ndim == 3 else full


def _token_major(x: np.ndarray) -> bool:
    """Whether x (B, H, L, Dh) is a view of a C-contiguous (B, L, H, Dh) array (and not contiguous itself)."""
    return not x.flags.c_contiguous and x.transpose(0, 2, 1, 3).flags.c_contiguous


def _in_shape(q: Any, k: Any, c: Any, s: Any) -> bool:
    """Whether ``run_rope`` takes these as they are, with no positions: C-contiguous 4-D float32 / float64
    arrays, k of q's dtype, B, L and Dh, tables of q's dtype, contiguous, (L, F), (1, L, F) or (B, L, F) of
    one shape with 2F <= Dh: exactly the calls the checked kernel API would take without a copy (the twin of
    ``tokenpos.torch.ops.rope._in_shape``)."""
    if not (type(q) is np.ndarray and q.ndim == 4 and q.flags.c_contiguous and q.dtype in KERNEL_DTYPES
            and type(c) is np.ndarray and type(s) is np.ndarray and c.dtype == q.dtype and s.dtype == q.dtype
            and c.shape == s.shape and c.flags.c_contiguous and s.flags.c_contiguous):
        return False
    B, _, L, Dh = q.shape
    if k is not None and not (type(k) is np.ndarray and k.ndim == 4 and k.flags.c_contiguous
                              and k.dtype == q.dtype and k.shape[0] == B and k.shape[2:] == q.shape[2:]):
        return False
    n = c.shape
    return (len(n) == 2 or (len(n) == 3 and n[0] in (1, B))) and n[-2] == L and 2 * n[-1] <= Dh


def _pass(q: Any, k: Any, cos: Any, sin: Any, layout: str, positions: Any, sign: float
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """One kernel pass over q (and k) into fresh outputs: straight to the compiled pass (``run_rope``) when the
    arrays are in shape (:func:`_in_shape`), else through the checked kernel API, which validates and copies."""
    if positions is not None or not _in_shape(q, k, cos, sin):
        checked = kernel.rope_apply if sign > 0 else kernel.rope_apply_backward
        return checked(q, k, cos, sin, layout=layout, positions=positions)      # type: ignore[no-any-return]
    # each output: what OUTPUTS.empty gives under its min_bytes (np.empty), without its two calls
    out = np.empty(q.shape, q.dtype) if q.nbytes < OUTPUTS.min_bytes else OUTPUTS.empty(q.shape, q.dtype)
    if k is None:
        run_rope(q, q[:, :0], cos, sin, layout == "interleaved", sign, True, out, out[:, :0])
        return out, None
    out_k = np.empty(k.shape, k.dtype) if k.nbytes < OUTPUTS.min_bytes else OUTPUTS.empty(k.shape, k.dtype)
    run_rope(q, k, cos, sin, layout == "interleaved", sign, True, out, out_k)
    return out, out_k


def rope_apply(q: Any, k: Any, cos: Any, sin: Any, *, layout: str = "half", positions: Any = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """``kernels.rope.rope_apply`` (the same arguments and results) as this module runs it: :func:`_pass`."""
    return _pass(q, k, cos, sin, layout, positions, 1.0)


def rope_apply_backward(grad_q: Any, grad_k: Any, cos: Any, sin: Any, *, layout: str = "half", positions: Any = None
                        ) -> tuple[np.ndarray, np.ndarray | None]:
    """``kernels.rope.rope_apply_backward`` (the same arguments and results) as this module runs it: :func:`_pass`."""
    return _pass(grad_q, grad_k, cos, sin, layout, positions, -1.0)


def _kernel(xs: tuple[np.ndarray, ...], cos: np.ndarray, sin: np.ndarray, interleaved: bool, sign: float,
            positions: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """One kernel pass over x (and k): ``xs`` (x,) or (q, k) (B, H*, L, Dh) -> rotated, in x's dtype; with
    positions, in q's memory order (module doc)."""
    run = rope_apply if sign > 0 else rope_apply_backward
    layout = "interleaved" if interleaved else "half"
    c, s = np.ascontiguousarray(cos, dtype=xs[0].dtype), np.ascontiguousarray(sin, dtype=xs[0].dtype)
    if positions is None or not _token_major(xs[0]):
        oq, ok = run(xs[0], xs[1] if len(xs) == 2 else None, c, s, layout=layout, positions=positions)
        return (oq,) if ok is None else (oq, ok)
    B, _, L, Dh = xs[0].shape
    flat = [x.transpose(0, 2, 1, 3).reshape(B * L, x.shape[1], 1, Dh) for x in xs]      # views: no copy
    pos = np.broadcast_to(np.asarray(positions).reshape(-1, L), (B, L)).reshape(B * L, 1)
    oq, ok = run(flat[0], flat[1] if len(xs) == 2 else None, c, s, layout=layout, positions=pos)
    outs = (oq,) if ok is None else (oq, ok)
    return tuple(o.reshape(B, L, x.shape[1], Dh).transpose(0, 2, 1, 3) for o, x in zip(outs, xs, strict=True))


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, sign: float,
            positions: np.ndarray | None = None) -> np.ndarray:
    """x (B, H, L, Dh) rotated by sign * angle, in x's dtype."""
    if use_kernel(x):
        return _kernel((x,), cos, sin, interleaved, sign, positions)[0]
    if positions is not None:
        cos, sin = cos[positions], sin[positions]                     # (L, R/2) / (Bp, L, R/2)
    s_full = _full(sin, x.dtype, interleaved)
    return rope_rotate(x, _full(cos, x.dtype, interleaved), s_full if sign > 0 else -s_full, interleaved=interleaved)


def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool,
                 positions: Any = None) -> tuple[np.ndarray, RopeCache]:
    """x (B, H, L, Dh) -> (rotated x (B, H, L, Dh), cache)."""
    return _rotate(x, cos, sin, interleaved, 1.0, positions), RopeCache(cos, sin, interleaved, positions)


def rope_backward(dout: np.ndarray, cache: RopeCache) -> np.ndarray:
    """dout (B, H, L, Dh) -> dx (B, H, L, Dh): the rotation by -angle."""
    return _rotate(dout, cache.cos, cache.sin, cache.interleaved, -1.0, cache.positions)


def rope_qk_forward(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool,
                    positions: Any = None) -> tuple[np.ndarray, np.ndarray, RopeCache]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) at the same positions -> (q', k', cache); one kernel pass."""
    cache = RopeCache(cos, sin, interleaved, positions)
    if use_kernel(q, k):
        q_out, k_out = _kernel((q, k), cos, sin, interleaved, 1.0, positions)
        return q_out, k_out, cache
    return _rotate(q, cos, sin, interleaved, 1.0, positions), _rotate(k, cos, sin, interleaved, 1.0, positions), cache


def rope_qk_backward(dq: np.ndarray, dk: np.ndarray, cache: RopeCache) -> tuple[np.ndarray, np.ndarray]:
    """(dq', dk') -> (dq, dk), both rotated by -angle; one kernel pass."""
    if use_kernel(dq, dk):
        gq, gk = _kernel((dq, dk), cache.cos, cache.sin, cache.interleaved, -1.0, cache.positions)
        return gq, gk
    return rope_backward(dq, cache), rope_backward(dk, cache)
