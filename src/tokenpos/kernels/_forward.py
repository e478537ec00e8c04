"""The compiled core of the embedding forward (float32/float64, and bf16 held as uint16 bits).

Shapes: V vocab, D model dim, N flat ids, Lp flat positions (row n uses ``pos_ids[n % Lp]``).

:func:`forward_core` is one ``prange`` over the output rows in order: numba gives each thread one
contiguous block, so each thread writes its part of the output sequentially.
:func:`forward_core_serial` runs the same rows on the calling thread, for outputs under
``embedding.PARALLEL_BYTES`` where a parallel launch costs more than it gives. A row is computed
one 64-byte line at a time (:mod:`._lines`, explicit 512-bit vectors), and before each line the
same line of the token row ``ahead`` rows on is prefetched into L1 and that of the row ``far``
rows on into L2 (``embedding.prefetch_rows``): the next rows' random reads are spread over this
row's arithmetic instead of waiting for it, and the far ones keep more reads in flight than the
near ones alone.
(Tiles of positions x batch rows that kept a positional row in L1, tuned on a Sapphire Rapids
guest, ran at 0.82-0.83x this plain loop's speed on an AMD EPYC guest: benchmarks/HISTORY.md, 2026-11-25.)
Per row:

    y[d]   = w[ids[n], d] * scale + pos[pos_ids[n % Lp], d]         (no fused multiply-add)
    out[d] = y[d] * m[d],   m = 1/(1-p) if keep(offset + n*D + d) else 0   (only when p > 0)

``m`` is a multiply (never a select), so NaN and Inf propagate through dropped elements as they
do in ``torch.nn.Dropout``. A row whose position is outside [0, P), or whose id is outside [0, V),
is skipped (the core's memory bound) and counted; the core returns that count and the caller raises the
shared :class:`PositionError` / :class:`TokenIdError` message. (Non-temporal stores, opt-in with
``stream=True`` until issue 29, never paid: 0.54-1.09x the plain stores in 16 runs, and no better in
model conditions; removed, benchmarks/HISTORY.md, 2026-11-27.)

bf16 (uint16 tables; :func:`row` picks :func:`_row_bf16` by the table's dtype): each value is
widened exactly (``bits << 16`` is the float32 with the same value), the row is computed in
float32 in the order above, and rounded once to bf16, round-to-nearest-even, NaN -> 0x7FC0 (the
rounding of ``torch.Tensor.bfloat16()``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from tokenpos.kernels._lines import lanes, line, line_drop, line_pos, line_pos_drop
from tokenpos.kernels._prefetch import prefetch_line, prefetch_line_l2
from tokenpos.kernels._rng import keep_bits, key_of


def _tail(w, pe, has_pos, scale, key, thr, inv, base, o, d0):  # pragma: no cover - compiled
    """o[d0:] = dropout(w * scale (+ pe)) element by element; ``base`` is element d0's dropout counter."""
    D = o.shape[0]
    zero = inv - inv
    for d in range(d0, D):
        y = w[d] * scale + pe[d] if has_pos else w[d] * scale
        o[d] = y * (inv if keep_bits(key, base + np.uint64(d - d0)) >= thr else zero) if thr != 0 else y


@intrinsic
def _bf16_to_f32(typingctx, bits):  # pragma: no cover - compiled
    """The float32 with the same value as bf16 ``bits`` (uint16): ``bits << 16``, reinterpreted."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        u32 = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(u32, ir.FloatType())

    return sig, codegen


@intrinsic
def _to_bf16(typingctx, y):  # pragma: no cover - compiled
    """float32 -> bf16 bits (uint16), round to nearest even; NaN -> 0x7FC0 (as ``Tensor.bfloat16()``).

    In 32-bit integer IR (``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``) so loops vectorise 16 wide.
    """
    sig = types.uint16(y)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        u = builder.bitcast(args[0], i32)
        lsb = builder.and_(builder.lshr(u, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        r = builder.lshr(builder.add(builder.add(u, ir.Constant(i32, 0x7FFF)), lsb), ir.Constant(i32, 16))
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.select(nan, ir.Constant(ir.IntType(16), 0x7FC0), builder.trunc(r, ir.IntType(16)))

    return sig, codegen


def _tail_bf16(w, pe, has_pos, scale, key, thr, inv, base, o, d0):  # pragma: no cover - compiled
    """:func:`_tail` for bf16 bits: widen, compute in float32 (``scale``/``inv`` float32), round once."""
    D = o.shape[0]
    zero = inv - inv
    for d in range(d0, D):
        y = _bf16_to_f32(w[d]) * scale
        if has_pos:
            y = y + _bf16_to_f32(pe[d])
        o[d] = _to_bf16(y * (inv if keep_bits(key, base + np.uint64(d - d0)) >= thr else zero) if thr != 0 else y)


def tail(w, pe, has_pos, scale, key, thr, inv, base, o, d0):  # pragma: no cover - typing stub
    """The rest of a row after its whole lines: :func:`_tail`, or :func:`_tail_bf16` for bf16 bits."""


@overload(tail, inline="always")
def _tail_overload(w, pe, has_pos, scale, key, thr, inv, base, o, d0):  # pragma: no cover - compiled
    return _tail_bf16 if isinstance(w.dtype, types.Integer) else _tail


@njit(inline="always", cache=True)
def _prefetch_ahead(nxt, far, d):  # pragma: no cover - compiled
    """Line ``d`` of the row a few rows on into L1, and of the one further on into L2."""
    prefetch_line(nxt, d)
    prefetch_line_l2(far, d)


@njit(inline="always", cache=True)
def row(w, pe, has_pos, scale, key, thr, inv, base, o, nxt, far):  # pragma: no cover - compiled
    """o[:] = dropout(w * scale (+ pe)) for one row; ``base`` is the row's first dropout counter.

    One 64-byte line at a time (:mod:`._lines`), each step first prefetching the same line of
    ``nxt`` (the token row a few rows on) into L1 and of ``far`` (one further on) into L2, so the
    next rows' reads overlap this row's arithmetic and more of them are in flight at once; then
    :func:`tail` for the elements after the last whole line."""
    D = o.shape[0]
    step = lanes(o)
    d1 = D - D % step
    if has_pos:
        if thr != 0:
            for d in range(0, d1, step):
                _prefetch_ahead(nxt, far, d)
                line_pos_drop(o, w, pe, scale, key, thr, inv, base + np.uint64(d), d)
        else:
            for d in range(0, d1, step):
                _prefetch_ahead(nxt, far, d)
                line_pos(o, w, pe, scale, key, thr, inv, base, d)
    elif thr != 0:
        for d in range(0, d1, step):
            _prefetch_ahead(nxt, far, d)
            line_drop(o, w, pe, scale, key, thr, inv, base + np.uint64(d), d)
    else:
        for d in range(0, d1, step):
            _prefetch_ahead(nxt, far, d)
            line(o, w, pe, scale, key, thr, inv, base, d)
    tail(w, pe, has_pos, scale, key, thr, inv, base + np.uint64(d1), o, d1)


@njit(inline="always", cache=True)
def _row_ahead(weight, ids, n, dist, r):  # pragma: no cover - compiled
    """The token row of flat row ``n + dist`` (the last row past the end), to prefetch; row ``r``'s
    own when ``dist`` is 0 or that id is outside the table."""
    j = ids[min(n + dist, ids.shape[0] - 1)] if dist else r
    return weight[j if 0 <= j < weight.shape[0] else r]


@njit(inline="always", cache=True)
def _row_at(weight, ids, scale, pos_table, pos_ids, has_pos, key, thr, inv, offset, ahead, far, n,
            o):  # pragma: no cover - compiled
    """Output row ``n`` into ``o`` (``out[n]``, or a scratch row), prefetching the token rows of flat
    rows ``n + ahead`` (into L1) and ``n + far`` (into L2); past the end, the last row; where that id
    is outside the table, this row's own (no prefetch address is ever computed from a bad id).
    Returns 1 if the row was skipped as bad, else 0."""
    V = weight.shape[0]
    D = weight.shape[1]
    P = pos_table.shape[0]
    q = pos_ids[n % pos_ids.shape[0]]
    r = ids[n]
    if q < 0 or q >= P or r < 0 or r >= V:
        return 1
    row(weight[r], pos_table[q], has_pos, scale, key, thr, inv, offset + np.uint64(n * D), o,
        _row_ahead(weight, ids, n, ahead, r), _row_ahead(weight, ids, n, far, r))
    return 0


@njit(parallel=True, cache=True)
def forward_core(weight, ids, scale, pos_table, pos_ids, has_pos, seed, thr, inv, offset,
                 ahead, far, out):  # pragma: no cover - compiled
    """out (N, D) = dropout(weight[ids] * scale + pos_table[pos_ids]); returns the count of rows with
    a bad id or position (nothing is read outside the tables).

    One ``prange`` over the output rows in order (numba splits it into one contiguous block per
    thread); while a row is computed, the token rows ``ahead`` rows on (into L1) and ``far`` rows on
    (into L2) are prefetched line by line (0: none).
    """
    N = ids.shape[0]
    key = key_of(seed)                                  # the dropout key of the seed bits (thr 0: unused)
    nbad = 0
    for n in prange(N):
        nbad += _row_at(weight, ids, scale, pos_table, pos_ids, has_pos, key, thr, inv, offset, ahead,
                        far, n, out[n])
    return nbad


@njit(cache=True)
def forward_core_serial(weight, ids, scale, pos_table, pos_ids, has_pos, seed, thr, inv, offset,
                        ahead, far, out):  # pragma: no cover - compiled
    """:func:`forward_core` on the calling thread: for outputs too small to pay for a parallel launch
    (``embedding.PARALLEL_BYTES``; measured: benchmarks/HISTORY.md), and in a forked child of a process
    on numba's omp pool (:func:`._threading.parallel`). It takes the same arguments, so the caller
    can pick either."""
    N = ids.shape[0]
    key = key_of(seed)
    nbad = 0
    for n in range(N):
        nbad += _row_at(weight, ids, scale, pos_table, pos_ids, has_pos, key, thr, inv, offset, ahead, far,
                        n, out[n])
    return nbad
