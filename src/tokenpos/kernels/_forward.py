"""Compiled cores of the embedding forward (float32/float64, and bf16 held as uint16 bits).

Shapes: V vocab, D model dim, N flat ids, Lp flat positions (row n uses ``pos_ids[n % Lp]``).

Each core is a plain ``prange`` over tasks of ``rows`` consecutive output rows. Per row:

    y[d]   = w[ids[n], d] * scale + pos[pos_ids[n % Lp], d]         (no fused multiply-add)
    out[d] = y[d] * m[d],   m = 1/(1-p) if keep(offset + n*D + d) else 0   (only when p > 0)

``m`` is a multiply (never a select), so NaN and Inf propagate through dropped elements as they
do in ``torch.nn.Dropout``. With ``check`` a row whose id is outside [0, V) is skipped and counted;
the core returns that count and the caller raises the shared :class:`TokenIdError` message. With
``stream`` (opt-in) each row is built in an L1 scratch row and written with non-temporal stores
(:mod:`._stream`); the result is the same bits either way.

bf16 (:func:`forward_bf16_core`): weight, pos and out are uint16 arrays of bf16 bits. Each value is
widened exactly (``bits << 16`` is the float32 with the same value), the row is computed in
float32 in the order above, and rounded once to bf16, round-to-nearest-even, NaN -> 0x7FC0 (the
rounding of ``torch.Tensor.bfloat16()``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tokenpos.kernels._rng import GOLDEN, keep_bits_mul
from tokenpos.kernels._stream import store_fence, stream_row


@njit(inline="always", cache=True)
def _row(w, pe, has_pos, scale, key, thr, inv, base, o):  # pragma: no cover - compiled
    """o[:] = dropout(w * scale (+ pe)) for one row; ``base`` is the row's first dropout counter."""
    D = o.shape[0]
    zero = inv - inv
    if has_pos:
        if thr != 0:
            ig = base * GOLDEN                          # counter * GOLDEN, carried by addition
            for d in range(D):
                o[d] = (w[d] * scale + pe[d]) * (inv if keep_bits_mul(key, ig) >= thr else zero)
                ig += GOLDEN
        else:
            for d in range(D):
                o[d] = w[d] * scale + pe[d]
    elif thr != 0:
        ig = base * GOLDEN
        for d in range(D):
            o[d] = (w[d] * scale) * (inv if keep_bits_mul(key, ig) >= thr else zero)
            ig += GOLDEN
    else:
        for d in range(D):
            o[d] = w[d] * scale


@njit(parallel=True, cache=True)
def forward_core(weight, ids, scale, pos_table, pos_ids, has_pos, key, thr, inv, offset, check, stream,
                 out_addr, rows, out):  # pragma: no cover - compiled
    """out (N, D) = dropout(weight[ids] * scale + pos_table[pos_ids]); returns the count of bad ids."""
    N = ids.shape[0]
    V = weight.shape[0]
    D = weight.shape[1]
    Lp = pos_ids.shape[0]
    row_bytes = np.uint64(D * out.itemsize)
    nbad = 0
    for task in prange((N + rows - 1) // rows):
        tmp = np.empty(D, out.dtype)
        for n in range(task * rows, min(N, task * rows + rows)):
            r = ids[n]
            if check and (r < 0 or r >= V):
                nbad += 1
                continue
            base = offset + np.uint64(n * D)
            o = tmp if stream else out[n]
            _row(weight[r], pos_table[pos_ids[n % Lp]], has_pos, scale, key, thr, inv, base, o)
            if stream:
                stream_row(out[n], tmp, out_addr + np.uint64(n) * row_bytes)
        if stream:
            store_fence()
    return nbad


@njit(inline="always", cache=True)
def _widen(bits, out32):  # pragma: no cover - compiled
    """bf16 bits (uint16) -> the float32 bit patterns of the same values (exact)."""
    for d in range(bits.shape[0]):
        out32[d] = np.uint32(bits[d]) << np.uint32(16)


@njit(inline="always", cache=True)
def _round_bf16(f32bits, out16):  # pragma: no cover - compiled
    """float32 bit patterns -> bf16 bits, round to nearest even; NaN -> 0x7FC0 (as torch)."""
    for d in range(f32bits.shape[0]):
        u = np.int64(f32bits[d])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out16[d] = 0x7FC0
        else:
            out16[d] = (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@njit(parallel=True, cache=True)
def forward_bf16_core(weight, ids, scale, pos_table, pos_ids, has_pos, key, thr, inv, offset, check, stream,
                      out_addr, rows, out):  # pragma: no cover - compiled
    """:func:`forward_core` for uint16 bf16 bits, computed in float32 (``scale``/``inv`` float32)."""
    N = ids.shape[0]
    V = weight.shape[0]
    D = weight.shape[1]
    Lp = pos_ids.shape[0]
    row_bytes = np.uint64(D * 2)
    nbad = 0
    for task in prange((N + rows - 1) // rows):
        wb = np.empty(D, np.uint32)
        pb = np.empty(D, np.uint32)
        yb = np.empty(D, np.uint32)
        o16 = np.empty(D, np.uint16)
        wf = wb.view(np.float32)
        pf = pb.view(np.float32)
        yf = yb.view(np.float32)
        for n in range(task * rows, min(N, task * rows + rows)):
            r = ids[n]
            if check and (r < 0 or r >= V):
                nbad += 1
                continue
            _widen(weight[r], wb)
            if has_pos:
                _widen(pos_table[pos_ids[n % Lp]], pb)
            _row(wf, pf, has_pos, scale, key, thr, inv, offset + np.uint64(n * D), yf)
            if stream:
                _round_bf16(yb, o16)
                stream_row(out[n], o16, out_addr + np.uint64(n) * row_bytes)
            else:
                _round_bf16(yb, out[n])
        if stream:
            store_fence()
    return nbad
