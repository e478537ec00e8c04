"""One 64-byte line of an embedding output row at a time, as explicit LLVM vector IR.

LLVM's loop vectoriser targets 256-bit registers on Intel server cores (``prefer-256-bit``) even
where 512-bit ones exist; explicit ``<16 x float>`` IR is lowered to full 512-bit instructions. Each
function here computes the :func:`lanes` elements ``d .. d + lanes - 1`` of one output row (one
64-byte line of the table row: 16 float32, 8 float64 or 32 bf16 values) with exactly the
element-by-element formula of :mod:`._forward` (no fused multiply-add, the same order):

    y = w[d] * scale (+ pe[d]);   o[d] = y * (inv if bits(key, base + d) >= thr else 0)

bf16 rows (uint16 bits) are widened exactly to float32 and rounded once (round to nearest even,
NaN -> 0x7FC0), as :func:`._forward._tail_bf16` does. The dropout bits are :mod:`._rng`'s, bit for
bit: the splitmix64 finaliser on 64-bit lanes, one hash per two output lanes (both 32-bit words of
it) when the line's first counter is even, one per lane otherwise. The unit of work is a line so that the
caller can prefetch one line of a later row per line it computes (:func:`._forward.row`).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from tokenpos.tables.formulas.dropout import GOLDEN, MIX1, MIX2

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
LINE = 64                 # bytes of table row per step: one cache line


def lanes_of(dtype: Any) -> int:
    """Elements per step for a row of numba dtype ``dtype``: one 64-byte line (16 float32, 8
    float64, 32 bf16 bits)."""
    return LINE // (dtype.bitwidth // 8)


def _s64(v: int) -> int:
    """A uint64 value as the signed i64 constant LLVM IR spells."""
    v = int(v) & (2**64 - 1)
    return v - 2**64 if v >= 2**63 else v


def _splat(builder, value, n):
    vt = ir.VectorType(value.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _vec_i64(values):
    return ir.Constant(ir.VectorType(_I64, len(values)), [ir.Constant(_I64, _s64(v)) for v in values])


def _mix(builder, z, n):
    """The splitmix64 finaliser of :mod:`._rng` on <n x i64> lanes (wrapping, logical shifts)."""
    for shift, mul in ((30, MIX1), (27, MIX2)):
        z = builder.mul(builder.xor(z, builder.lshr(z, _vec_i64([shift] * n))), _vec_i64([mul] * n))
    return builder.xor(z, builder.lshr(z, _vec_i64([31] * n)))


def _pair_hashes(builder, key, c, h):
    """<h x i64>: the hashes of the counter pairs ``(c >> 1) + k``, k < h (``c`` even: the pairs of
    counters c .. c + 2h - 1; lane k's low word is counter c + 2k's, its high word c + 2k + 1's)."""
    jg = builder.mul(builder.lshr(c, ir.Constant(_I64, 1)), ir.Constant(_I64, _s64(GOLDEN)))
    z = builder.add(_splat(builder, jg, h), _vec_i64([k * int(GOLDEN) for k in range(h)]))
    return _mix(builder, builder.xor(z, _splat(builder, key, h)), h)


def _keep_any(builder, key, c, thr, n):
    """<n x i1> for counters c .. c + n - 1, any ``c``: one hash per lane, the lane's word of it."""
    cv = builder.add(_splat(builder, c, n), _vec_i64(list(range(n))))
    z = builder.mul(builder.lshr(cv, _vec_i64([1] * n)), _vec_i64([GOLDEN] * n))
    z = _mix(builder, builder.xor(z, _splat(builder, key, n)), n)
    shift = builder.add(builder.shl(builder.and_(cv, _vec_i64([1] * n)), _vec_i64([5] * n)), _vec_i64([8] * n))
    bits = builder.and_(builder.lshr(z, shift), _vec_i64([0xFFFFFF] * n))
    return builder.icmp_unsigned(">=", bits, _splat(builder, thr, n))


def _by_parity(builder, c, if_even, if_odd):
    """The values ``if_even()`` builds when counter ``c`` is even, else ``if_odd()``'s (tuples of
    the same types): one branch, one phi per value."""
    even = builder.icmp_unsigned("==", builder.and_(c, ir.Constant(_I64, 1)), ir.Constant(_I64, 0))
    with builder.if_else(even, likely=True) as (then, otherwise):
        with then:
            a, bb_a = if_even(), builder.block
        with otherwise:
            b, bb_b = if_odd(), builder.block
    out = []
    for x, y in zip(a, b, strict=True):
        phi = builder.phi(x.type)
        phi.add_incoming(x, bb_a)
        phi.add_incoming(y, bb_b)
        out.append(phi)
    return out


def _keep_mask(builder, key, c, thr, n):
    """<n x i1>: lane k keeps when counter c + k's 24 hash bits are >= thr (:mod:`._rng`'s formula);
    for ``c`` even, n / 2 hashes whose two words give two lanes each."""
    def even():
        words = builder.bitcast(_pair_hashes(builder, key, c, n // 2), ir.VectorType(_I32, n))  # little-endian
        bits = builder.lshr(words, ir.Constant(ir.VectorType(_I32, n), [8] * n))
        return (builder.icmp_unsigned(">=", bits, _splat(builder, builder.trunc(thr, _I32), n)),)

    return _by_parity(builder, c, even, lambda: (_keep_any(builder, key, c, thr, n),))[0]


def _keep_halves(builder, key, c, thr, h):
    """(even, odd) <h x i1> masks of counters c + 2k and c + 2k + 1 (k < h): for ``c`` even the two
    words of hash k, no shuffle; else :func:`_keep_any`'s lanes, split."""
    def even():
        z, t = _pair_hashes(builder, key, c, h), _splat(builder, thr, h)
        lo = builder.lshr(builder.and_(z, _vec_i64([0xFFFFFFFF] * h)), _vec_i64([8] * h))
        return builder.icmp_unsigned(">=", lo, t), builder.icmp_unsigned(">=", builder.lshr(z, _vec_i64([40] * h)), t)

    def odd():
        m = _keep_any(builder, key, c, thr, 2 * h)
        return tuple(builder.shuffle_vector(m, m, ir.Constant(ir.VectorType(_I32, h), [2 * k + j for k in range(h)]))
                     for j in (0, 1))

    me, mo = _by_parity(builder, c, even, odd)
    return me, mo


def _vptr(context, builder, aryty, ary, d, vt):
    """A ``<n x T>*`` to element ``d`` of a 1-D array (no bounds check, no wrap-around)."""
    a = context.make_array(aryty)(context, builder, ary)
    p = cgutils.get_item_pointer(context, builder, aryty, a, [d], wraparound=False)
    return builder.bitcast(p, vt.as_pointer())


def _round_bf16_word(builder, y, h, high):
    """<h x float> -> <h x i32> holding its bf16 bits (round to nearest even, NaN -> 0x7FC0) in the
    word's high half (``high``) or low half, the other half zero."""
    vi = ir.VectorType(_I32, h)
    u = builder.bitcast(y, vi)
    lsb = builder.and_(builder.lshr(u, ir.Constant(vi, [16] * h)), ir.Constant(vi, [1] * h))
    r = builder.add(builder.add(u, ir.Constant(vi, [0x7FFF] * h)), lsb)
    r = builder.and_(r, ir.Constant(vi, [0xFFFF0000] * h)) if high else builder.lshr(r, ir.Constant(vi, [16] * h))
    nan = builder.fcmp_unordered("uno", y, y)
    return builder.select(nan, ir.Constant(vi, [0x7FC00000 if high else 0x7FC0] * h), r)


def _line_bf16(context, builder, signature, args, has_pos, drop):
    """A line of 32 bf16 values as 16 32-bit words: the low halves (even elements) widen by ``<< 16``,
    the high halves (odd elements) by masking the low half off; both are computed in float32 and
    rounded back into their halves. No lane crosses a word, so nothing is shuffled (little-endian)."""
    oty, wty, pty = signature.args[:3]
    o, w, pe, scale, key, thr, inv, c, d = args
    h = LINE // 4
    vi, vf = ir.VectorType(_I32, h), ir.VectorType(ir.FloatType(), h)

    def halves(ary_ty, ary):
        v = builder.load(_vptr(context, builder, ary_ty, ary, d, vi), align=2)
        ev = builder.bitcast(builder.shl(v, ir.Constant(vi, [16] * h)), vf)
        od = builder.bitcast(builder.and_(v, ir.Constant(vi, [0xFFFF0000] * h)), vf)
        return ev, od

    s = _splat(builder, scale, h)
    ye, yo = (builder.fmul(x, s) for x in halves(wty, w))
    if has_pos:
        pe_e, pe_o = halves(pty, pe)
        ye, yo = builder.fadd(ye, pe_e), builder.fadd(yo, pe_o)
    if drop:
        me, mo = _keep_halves(builder, key, c, thr, h)
        iv, zero = _splat(builder, inv, h), ir.Constant(vf, [ir.Constant(ir.FloatType(), 0.0)] * h)
        ye, yo = builder.fmul(ye, builder.select(me, iv, zero)), builder.fmul(yo, builder.select(mo, iv, zero))
    word = builder.or_(_round_bf16_word(builder, ye, h, False), _round_bf16_word(builder, yo, h, True))
    builder.store(word, _vptr(context, builder, oty, o, d, vi), align=2)
    return context.get_dummy_value()


def _line_codegen(has_pos: bool, drop: bool):
    def codegen(context, builder, signature, args):
        oty, wty, pty = signature.args[:3]
        if isinstance(wty.dtype, types.Integer):
            return _line_bf16(context, builder, signature, args, has_pos, drop)
        o, w, pe, scale, key, thr, inv, c, d = args
        n = lanes_of(wty.dtype)
        ety = context.get_value_type(wty.dtype)
        align = wty.dtype.bitwidth // 8
        vt = ir.VectorType(ety, n)
        wv = builder.load(_vptr(context, builder, wty, w, d, vt), align=align)
        y = builder.fmul(wv, _splat(builder, scale, n))
        if has_pos:
            y = builder.fadd(y, builder.load(_vptr(context, builder, pty, pe, d, vt), align=align))
        if drop:
            zero = ir.Constant(y.type, [ir.Constant(y.type.element, 0.0)] * n)
            y = builder.fmul(y, builder.select(_keep_mask(builder, key, c, thr, n), _splat(builder, inv, n), zero))
        builder.store(y, _vptr(context, builder, oty, o, d, vt), align=align)
        return context.get_dummy_value()

    return codegen


def _make_line(has_pos: bool, drop: bool):
    def typer(typingctx, o, w, pe, scale, key, thr, inv, c, d):
        return types.void(o, w, pe, scale, key, thr, inv, c, d), _line_codegen(has_pos, drop)

    return intrinsic(typer)


# o[d : d + lanes] of one output row; ``c`` is base + d, the lane-0 dropout counter (uint64).
# Arguments: (o, w, pe, scale, key, thr, inv, c, d); pe, key, thr, inv and c are ignored where the
# name says the line has no positions or no dropout.
line = _make_line(False, False)
line_pos = _make_line(True, False)
line_drop = _make_line(False, True)
line_pos_drop = _make_line(True, True)


@intrinsic
def lanes(typingctx, row):  # pragma: no cover - compiled
    """The vector width, in elements, of the line functions for a 1-D row (a compile-time constant)."""
    n = lanes_of(row.dtype)

    def codegen(context, builder, signature, args):
        return ir.Constant(_I64, n)

    return types.int64(row), codegen
