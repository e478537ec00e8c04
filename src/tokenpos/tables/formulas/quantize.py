"""8-bit input tables: symmetric per-row quantisation to int8 or float8 e4m3fn, and the lookup that dequantises.

Every tokenpos table (``TokenEmbedding``, ``PerLayerEmbedding``, ``HashedNgramEmbedding``) with ``weight_dtype``
set stores ``q`` (V, C) of 8 bits and one scale per row ``scale`` (V,); a lookup reads only the gathered rows:

    int8:   scale[r] = max|W[r]| / 127,  q[r] = clip(rint(W[r] / scale[r]), -127, 127)       (-128 never used)
    e4m3fn: scale[r] = max|W[r]| / 448,  q[r] = e4m3fn(clip(W[r] / scale[r], -448, 448))     (round to nearest even)
    out     = (float(q[ids]) * float(scale[ids])) * float(multiplier)                      (in float32, float64 for
              float64 scales; rounded once to the scales' dtype)

``W / scale`` is computed in float64 from the scale as stored (rounded to its dtype), and a zero row has scale 0
and q 0. e4m3fn (torch's ``float8_e4m3fn``, the OCP FP8 format without infinities): 1 sign bit, 4 exponent bits
(bias 7), 3 mantissa bits; subnormals below 2**-6 in steps of 2**-9; the largest finite magnitude 448; 0x7F and
0xFF are NaN. NumPy has no float8 dtype, so e4m3fn values are held as their uint8 bit patterns here
(``tensor.view(torch.uint8)``); :data:`E4M3_DECODE` is the exact value of each of the 256 patterns, and
:func:`encode_e4m3` rounds exactly (torch's conversion of the same clipped values, checked for every bfloat16 in
tests/tables/test_quantize.py). The clip makes the encoding saturate: torch's conversion sends magnitudes from
464 (exclusive) to NaN, which a quantised table never holds.

Shapes: V rows, C columns, ids (...), out (..., C).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_choice
from tokenpos.tables.errors import ConfigError

INT8_MAX = 127
"""The largest magnitude of a quantised int8 entry: symmetric int8 in [-127, 127] (-128 is never used)."""
E4M3_MAX = 448.0
"""The largest finite magnitude of float8 e4m3fn: 1.75 * 2**8."""
FORMATS = ("int8", "float8_e4m3fn")
"""The 8-bit formats of a quantised table: int8 (both backends) and float8 e4m3fn (torch only stores it as a
dtype; the formulas here hold its bit patterns as uint8)."""
SCALE_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The dtypes a table's scales (and so its output) may have. NumPy has no bfloat16: a "bfloat16" scale is
returned as float32 holding bfloat16 values (rounded to nearest even), which a torch copy to bfloat16 keeps."""


def _e4m3_decode_table() -> np.ndarray:
    """(256,) float32: the value of every e4m3fn bit pattern (NaN for 0x7F and 0xFF)."""
    bits = np.arange(256)
    exp = (bits >> 3) & 0xF
    man = (bits & 7).astype(np.float64)
    mag = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag = np.where((bits & 0x7F) == 0x7F, np.nan, mag)
    out = np.where(bits & 0x80, -mag, mag).astype(np.float32)
    out.flags.writeable = False
    return out


E4M3_DECODE = _e4m3_decode_table()
"""(256,) float32, read-only: ``E4M3_DECODE[b]`` is the exact value of the e4m3fn pattern ``b``."""


def _int8_decode_table() -> np.ndarray:
    out = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
    out.flags.writeable = False
    return out


INT8_DECODE = _int8_decode_table()
"""(256,) float32, read-only: ``INT8_DECODE[b]`` is the int8 whose bit pattern is ``b`` (the kernels' one
lookup for both formats: q viewed as uint8 indexes the table of its format)."""


def decode_table(fmt: str) -> np.ndarray:
    """The (256,) float32 value of every bit pattern of ``fmt`` (one of :data:`FORMATS`)."""
    return INT8_DECODE if check_choice("fmt", fmt, FORMATS) == "int8" else E4M3_DECODE


def encode_e4m3(x: Any) -> np.ndarray:
    """Float values (any shape, finite, |x| <= 448) -> their e4m3fn bit patterns (uint8), rounded to nearest, ties
    to even, exactly (from the float64 value: no double rounding); -0.0 keeps its sign bit.

    Normal range (|x| >= 2**-6): the quantum of x's binade is 2**(e - 3) (3 mantissa bits); below it the subnormal
    quantum 2**-9. ``np.rint`` of x / quantum is exact (a power-of-two division) and rounds half to even; a value
    that rounds up into the next binade gets that binade's pattern (the carry into the exponent field).
    """
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any() or (np.abs(x) > E4M3_MAX).any():
        raise ConfigError(f"encode_e4m3 takes finite values in [-{E4M3_MAX:g}, {E4M3_MAX:g}]; got "
                          f"{x[np.isnan(x) | (np.abs(x) > E4M3_MAX)].reshape(-1)[0]}")
    a = np.abs(x)
    normal = a >= 2.0 ** -6
    _, e2 = np.frexp(a)                                        # a = m * 2**e2, m in [0.5, 1): binade 2**(e2 - 1)
    e = np.where(normal, e2.astype(np.int64) - 1, -6)          # subnormals: binade -6's quantum 2**-9
    k = np.rint(np.ldexp(a, 3 - e)).astype(np.int64)           # units of the quantum: 8..16 (normal), 0..8 (sub)
    # pattern = (e + 7) << 3 plus the mantissa k - 8 for normal k in [8, 16] (16: the next binade), k for subnormals
    mag_bits = np.where(normal, (e + 6) * 8 + k, k)
    return (mag_bits | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def _round_scales(scale: np.ndarray, scale_dtype: str) -> np.ndarray:
    """float64 scales rounded to ``scale_dtype`` (bfloat16: float32 holding the bfloat16 values)."""
    if scale_dtype != "bfloat16":
        return scale.astype(scale_dtype)
    bits = scale.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) << np.uint64(16)
    return rounded.astype(np.uint32).view(np.float32)


def quantize_rows(weight: np.ndarray, scale_dtype: Any = np.float32, fmt: str = "int8"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row quantisation of a (V, C) float table: (q (V, C), scale (V,)).

    ``fmt`` "int8": q int8, ``scale[r] = max|W[r]| / 127`` rounded to ``scale_dtype``, ``q[r] = clip(rint(W[r] /
    scale[r]), -127, 127)``. ``fmt`` "float8_e4m3fn": q uint8 (e4m3fn bit patterns), ``scale[r] = max|W[r]| /
    448``, ``q[r] = e4m3fn(clip(W[r] / scale[r], -448, 448))``. Both in float64 from the rounded scale; a zero row
    has scale 0 and q 0. ``scale_dtype``: one of :data:`SCALE_DTYPES` (a NumPy dtype or its name; "bfloat16"
    returns float32 scales holding bfloat16 values). The table a quantised layer reads is the dequantisation
    of these stored values (:func:`dequantize_rows`).
    """
    fmt = check_choice("fmt", fmt, FORMATS)
    name = scale_dtype if isinstance(scale_dtype, str) else np.dtype(scale_dtype).name
    name = check_choice("scale_dtype", name, SCALE_DTYPES)
    w = np.asarray(weight, dtype=np.float64)
    top = INT8_MAX if fmt == "int8" else E4M3_MAX
    scale = _round_scales(np.abs(w).max(axis=1, initial=0.0) / top, name)
    s = scale.astype(np.float64)[:, None]                                    # (V, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.clip(np.where(s > 0, w / s, 0.0), -top, top)
    if fmt == "int8":
        return np.rint(x).astype(np.int8), scale
    return encode_e4m3(x), scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray, ids: np.ndarray, multiplier: float) -> np.ndarray:
    """The definition of a quantised table's lookup: q (V, C) int8 (or uint8 e4m3fn patterns), scale (V,),
    ids (...) -> (..., C) in scale's dtype = ``(float(q[ids]) * float(scale[ids])) * float(multiplier)``, two
    products in float32 (float64 for a float64 scale), rounded once to scale's dtype. Both backends compute exactly
    this, on the gathered rows only (the fused kernels: :mod:`tokenpos.kernels.quantized`).
    """
    ct = np.dtype(np.float64 if scale.dtype == np.float64 else np.float32)
    if q.dtype == np.uint8:
        rows = E4M3_DECODE[q[ids]].astype(ct)                                # (..., C), exact
    elif q.dtype == np.int8:
        rows = q[ids].astype(ct)
    else:
        raise ConfigError(f"q must be int8 or uint8 (e4m3fn bit patterns), got {q.dtype}")
    rows = rows * scale[ids].astype(ct)[..., None]                           # (..., C)
    return (rows * ct.type(multiplier)).astype(scale.dtype, copy=False)
