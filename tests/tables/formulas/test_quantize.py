"""tables.formulas.quantize: the 8-bit definitions (int8 and float8 e4m3fn per-row quantisation, the lookup that
dequantises), each checked against what it claims to equal: torch's float8_e4m3fn conversion and decoding for
every bfloat16 value and every bit pattern, and the quantisation's own bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.quantize import (
    E4M3_DECODE,
    E4M3_MAX,
    INT8_DECODE,
    INT8_MAX,
    decode_table,
    dequantize_rows,
    encode_e4m3,
    quantize_rows,
)

torch = pytest.importorskip("torch")


def _torch_e4m3_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(x, np.float64)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def test_the_decode_table_is_torchs_value_of_every_e4m3fn_pattern():
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(E4M3_DECODE, values)                     # NaN at 0x7F and 0xFF in both
    assert np.isnan(E4M3_DECODE[[0x7F, 0xFF]]).all() and np.isfinite(np.delete(E4M3_DECODE, [0x7F, 0xFF])).all()
    assert E4M3_DECODE[0x7E] == E4M3_MAX and E4M3_DECODE[1] == 2.0 ** -9 and np.signbit(E4M3_DECODE[0x80])
    np.testing.assert_array_equal(INT8_DECODE, np.arange(256, dtype=np.uint8).view(np.int8))
    assert decode_table("int8") is INT8_DECODE and decode_table("float8_e4m3fn") is E4M3_DECODE


def test_encode_is_torchs_conversion_for_every_bfloat16_in_range():
    """All 2**16 bfloat16 patterns: the finite ones within [-448, 448] (ties between e4m3 values included, in
    the normal and subnormal ranges) encode to torch's float8_e4m3fn bits."""
    bf16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double().numpy()
    x = bf16[np.isfinite(bf16) & (np.abs(bf16) <= E4M3_MAX)]
    assert x.size > 30000
    np.testing.assert_array_equal(encode_e4m3(x), _torch_e4m3_bits(x))
    # and every e4m3 value encodes to its own pattern (0x80: -0.0 keeps its sign)
    finite = np.delete(np.arange(256), [0x7F, 0xFF])
    np.testing.assert_array_equal(encode_e4m3(E4M3_DECODE[finite].astype(np.float64)), finite)


@given(st.lists(st.floats(-E4M3_MAX, E4M3_MAX, allow_nan=False), min_size=1, max_size=64))
def test_encode_is_torchs_conversion_for_float64_values(values):
    x = np.array(values, np.float64)
    got = encode_e4m3(x)
    # torch converts float64 to float8 through float32 (a double rounding); compare where that is exact
    exact = x.astype(np.float32).astype(np.float64) == x
    np.testing.assert_array_equal(got[exact], _torch_e4m3_bits(x[exact]))
    # round to nearest: no e4m3 value is nearer than the one chosen
    finite = E4M3_DECODE[np.isfinite(E4M3_DECODE)].astype(np.float64)
    err = np.abs(E4M3_DECODE[got].astype(np.float64) - x)
    best = np.abs(finite[None, :] - x[:, None]).min(axis=1)
    np.testing.assert_array_equal(err, best)


def test_encode_refuses_values_it_cannot_hold():
    with pytest.raises(ConfigError, match="449"):
        encode_e4m3([1.0, 449.0])
    with pytest.raises(ConfigError, match="nan"):
        encode_e4m3([np.nan])


@pytest.mark.parametrize("fmt", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16", "float32", "float64"])
def test_quantize_rows_per_row_scale_and_rounding(fmt, scale_dtype):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 9)) * rng.uniform(0.01, 5.0, (12, 1))
    w[3] = 0.0                                                              # a zero row
    w[5, 2] = -np.abs(w[5]).max() * 1.5                                     # the row's largest entry negative
    q, s = quantize_rows(w, scale_dtype, fmt)
    top = INT8_MAX if fmt == "int8" else E4M3_MAX
    want_scale = np.abs(w).max(axis=1) / top
    if scale_dtype == "bfloat16":
        assert s.dtype == np.float32
        want = torch.from_numpy(want_scale).float().bfloat16().float().numpy()
        np.testing.assert_array_equal(s, want)
    else:
        assert s.dtype == np.dtype(scale_dtype)
        np.testing.assert_array_equal(s, want_scale.astype(scale_dtype))
    assert s[3] == 0 and not q[3].any()
    x = np.clip(w / np.where(s > 0, s, 1).astype(np.float64)[:, None], -top, top)
    if fmt == "int8":
        assert q.dtype == np.int8
        np.testing.assert_array_equal(q, np.rint(x).astype(np.int8))
        assert np.abs(q.astype(int)).max() == INT8_MAX and q.min() >= -INT8_MAX
    else:
        assert q.dtype == np.uint8
        np.testing.assert_array_equal(q, _torch_e4m3_bits(x))             # torch's conversion of the same values
        assert np.nanmax(np.abs(E4M3_DECODE[q])) == E4M3_MAX
    # each row's largest magnitude maps to the format's largest value (up to the scale's rounding)
    deq = dequantize_rows(q, s.astype(np.float64), np.arange(12), 1.0)
    step = (0.5 if fmt == "int8" else 16.0) * s.astype(np.float64)[:, None] * (1 + 2.0 ** -7)
    assert (np.abs(deq - w) <= step + 1e-12).all()


@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32, np.float64])
def test_dequantize_rows_is_two_products_rounded_once(scale_dtype):
    q = np.array([[0x38, 0xC0], [0x7E, 0x01]], dtype=np.uint8)               # e4m3: 1, -2; 448, 2**-9
    s = np.array([0.5, 3.0], dtype=scale_dtype)
    got = dequantize_rows(q, s, np.array([[1, 0, 1]]), 0.1)
    ct = np.float64 if scale_dtype == np.float64 else np.float32
    want = np.array([[[448, 2.0 ** -9], [1, -2], [448, 2.0 ** -9]]], ct) * s[[1, 0, 1]].astype(ct)[None, :, None]
    np.testing.assert_array_equal(got, (want * ct(0.1)).astype(scale_dtype))
    assert got.dtype == np.dtype(scale_dtype) and got.shape == (1, 3, 2)
    with pytest.raises(ConfigError, match="int8 or uint8"):
        dequantize_rows(q.astype(np.int16), s, np.array([0]), 1.0)


def test_bad_formats_and_scale_dtypes_are_named():
    with pytest.raises(ConfigError, match="fmt"):
        quantize_rows(np.ones((2, 2)), np.float32, "int4")
    with pytest.raises(ConfigError, match="scale_dtype"):
        quantize_rows(np.ones((2, 2)), np.int8)
