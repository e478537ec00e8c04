"""The 8-bit table lookup, dequantised inside the gather: one pass over the gathered rows, one write.

Shapes: V rows, C columns, N flat ids (any id shape (...) is flattened in C order), out (N, C).

    out[n, c] = (float(q[ids[n], c]) * float(scale[ids[n]])) * multiplier

in float32 (float64 for float64 scales), two products, no fused multiply-add, rounded once to the output dtype,
which is the scales' dtype: exactly :func:`tokenpos.tables.formulas.quantize.dequantize_rows` (its twin and test
oracle). q is int8 (converted directly) or the uint8 bit patterns of float8 e4m3fn (read through the exact
256-entry :data:`~tokenpos.tables.formulas.quantize.E4M3_DECODE`). 16-bit outputs are held as their bit patterns
and told apart by the array's signedness: bfloat16 as uint16 (widened by ``bits << 16``, rounded as
``Tensor.bfloat16()`` by :func:`._forward._to_bf16`), float16 as int16 (LLVM's ``fpext`` / ``fptrunc``: exact,
and round to nearest even, as NumPy's and torch's casts); numba has no float16 arrays.

The rows run in parallel (one ``prange`` over them) for outputs of at least
:data:`tokenpos.kernels.embedding.PARALLEL_BYTES`, on the calling thread below it, as the embedding forward
decides. A row whose id lies outside [0, V) is skipped (nothing is read out of bounds) and counted; the caller
raises :class:`~tokenpos.tables.errors.KernelBoundError` naming the first bad id.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from tokenpos._config import OUTPUTS
from tokenpos.kernels import embedding as _embedding
from tokenpos.kernels._forward import _bf16_to_f32, _to_bf16
from tokenpos.kernels._threading import parallel, parallel_guard
from tokenpos.tables.checks.validation import check_token_ids
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.quantize import E4M3_DECODE

_SCALES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.uint16), np.dtype(np.int16))


@intrinsic
def _f16_to_f32(typingctx, bits):  # pragma: no cover - compiled
    """float16 ``bits`` (int16) -> the float32 of the same value (``fpext``: exact)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _to_f16(typingctx, y):  # pragma: no cover - compiled
    """float32 -> float16 bits (int16), round to nearest even (``fptrunc``), overflow to +-inf."""
    sig = types.int16(y)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


def load_scale(scale, r):  # pragma: no cover - typing stub
    """scale[r] as the compute float: float32 / float64 as stored, bf16 (uint16) and fp16 (int16) bits widened."""


@overload(load_scale, inline="always")
def _load_scale(scale, r):  # pragma: no cover - compiled
    if scale.dtype == types.uint16:
        return lambda scale, r: _bf16_to_f32(scale[r])
    if scale.dtype == types.int16:
        return lambda scale, r: _f16_to_f32(scale[r])
    return lambda scale, r: scale[r]


def store(o, d, y):  # pragma: no cover - typing stub
    """o[d] = y rounded once to o's dtype (uint16: bf16 bits, int16: fp16 bits)."""


@overload(store, inline="always")
def _store(o, d, y):  # pragma: no cover - compiled
    if o.dtype == types.uint16:
        def bf16(o, d, y):
            o[d] = _to_bf16(y)
        return bf16
    if o.dtype == types.int16:
        def fp16(o, d, y):
            o[d] = _to_f16(y)
        return fp16

    def plain(o, d, y):
        o[d] = y
    return plain


def decode(q, lut, d):  # pragma: no cover - typing stub
    """The float32 value of q[d]: an int8 converted, an e4m3fn pattern (uint8) read from ``lut``."""


@overload(decode, inline="always")
def _decode(q, lut, d):  # pragma: no cover - compiled
    if q.dtype == types.int8:
        return lambda q, lut, d: np.float32(q[d])
    return lambda q, lut, d: lut[q[d]]


@njit(inline="always", cache=True)
def _row(qr, lut, s, mult, o):  # pragma: no cover - compiled
    for d in range(o.shape[0]):
        store(o, d, (decode(qr, lut, d) * s) * mult)


@njit(parallel=True, cache=True)
def gather_core(q, lut, scale, ids, mult, out):  # pragma: no cover - compiled
    """out (N, C) = dequantised q[ids] (see the module doc); returns the count of rows skipped for a bad id."""
    V = q.shape[0]
    nbad = 0
    for n in prange(ids.shape[0]):
        r = ids[n]
        if r < 0 or r >= V:
            nbad += 1
        else:
            _row(q[r], lut, load_scale(scale, r), mult, out[n])
    return nbad


@njit(cache=True)
def gather_core_serial(q, lut, scale, ids, mult, out):  # pragma: no cover - compiled
    """:func:`gather_core` on the calling thread (small outputs; a forked child of numba's omp pool)."""
    V = q.shape[0]
    nbad = 0
    for n in range(ids.shape[0]):
        r = ids[n]
        if r < 0 or r >= V:
            nbad += 1
        else:
            _row(q[r], lut, load_scale(scale, r), mult, out[n])
    return nbad


def gather_dequantized(q: np.ndarray, scale: np.ndarray, ids: np.ndarray, multiplier: float,
                       out: np.ndarray) -> np.ndarray:
    """The fused lookup on inputs a layer has checked (the entry both backends call): q (V, C) int8 or uint8
    (e4m3fn patterns), scale (V,) float32 / float64 / uint16 (bf16 bits) / int16 (fp16 bits), ids (...) integer,
    out (..., C) C-contiguous of scale's dtype, returned. Only the layout is normalised here; a row with an id
    outside [0, V) is skipped and raises ``KernelBoundError`` naming the first bad id."""
    N, C = ids.size, q.shape[1]
    if not (N and C):
        return out
    ct = np.float64 if scale.dtype == np.float64 else np.float32
    flat = np.ascontiguousarray(ids).reshape(-1)
    args = (np.ascontiguousarray(q), E4M3_DECODE, np.ascontiguousarray(scale), flat, ct(multiplier),
            out.reshape(N, C))
    if out.nbytes < _embedding.PARALLEL_BYTES:
        skipped = gather_core_serial(*args)
    else:
        with parallel_guard():
            skipped = parallel(gather_core, gather_core_serial)(*args)
    if skipped:
        raise _embedding.bound_error(flat, q.shape[0], None, None, skipped)
    return out


def quantized_embedding(q: Any, scale: Any, ids: Any, multiplier: float = 1.0, *, out: np.ndarray | None = None
                        ) -> np.ndarray:
    """The checked kernel API: q (V, C) int8 or uint8 (float8 e4m3fn bit patterns), scale (V,) float16 /
    float32 / float64 (or uint16 bf16 bits), ids (...) in [0, V) (checked: TokenIdError) -> (..., C) of scale's
    dtype (uint16 bf16 bits for uint16 scales), ``out`` if given (C-contiguous, that dtype and shape)."""
    q, scale = np.asarray(q), np.asarray(scale)
    if q.ndim != 2 or q.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise ConfigError(f"q must be a (V, C) int8 or uint8 (e4m3fn bits) table, got {q.dtype} {q.shape}")
    if scale.shape != (q.shape[0],) or scale.dtype not in _SCALES + (np.dtype(np.float16),):
        raise ConfigError(f"scale must be ({q.shape[0]},) float16 / float32 / float64 (or uint16 bf16 bits), got "
                          f"{scale.dtype} {scale.shape}")
    idx = check_token_ids(ids, q.shape[0])
    shape = idx.shape + (q.shape[1],)
    if out is None:
        out = OUTPUTS.empty(shape, scale.dtype)
    elif (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != scale.dtype
          or not out.flags.c_contiguous or not out.flags.writeable):
        raise ConfigError(f"out must be a writeable C-contiguous {scale.dtype} array of shape {shape}, got "
                          f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    half = scale.dtype == np.float16                                          # fp16 travels as int16 bits
    gather_dequantized(q, scale.view(np.int16) if half else scale, idx, multiplier, out.view(np.int16) if half else out)
    return out
