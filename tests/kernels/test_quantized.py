"""The numba 8-bit lookup (kernels.quantized) against its definition, ``tables.formulas.quantize.dequantize_rows``:
bit for bit, every scale / output dtype (float16 and bfloat16 as bits), int8 and float8 e4m3fn tables, serial and
parallel cores, any ids shape; a bad id is never read and is named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos.kernels.embedding as E
from tokenpos.kernels.quantized import gather_dequantized, quantized_embedding
from tokenpos.tables.errors import ConfigError, KernelBoundError, TokenIdError
from tokenpos.tables.formulas.quantize import dequantize_rows, quantize_rows

FORMATS = ["int8", "float8_e4m3fn"]


def _table(V, C, fmt, scale_dtype, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((V, C)) * rng.uniform(0.01, 4.0, (V, 1))
    if V > 2:
        w[1] = 0.0
    return quantize_rows(w, scale_dtype, fmt)


@pytest.fixture(params=["serial", "parallel"])
def core(request, monkeypatch):
    """Both cores: PARALLEL_BYTES 0 sends every call to the parallel one, a huge one to the serial one."""
    monkeypatch.setattr(E, "PARALLEL_BYTES", 0 if request.param == "parallel" else 1 << 40)
    return request.param


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32, np.float64])
def test_equals_the_definition_bit_for_bit(fmt, scale_dtype, core):
    q, s = _table(37, 29, fmt, scale_dtype)
    ids = np.random.default_rng(1).integers(0, 37, (3, 11))
    for mult in (1.0, 2.0 ** 0.5, 16.0):
        got = quantized_embedding(q, s, ids, mult)
        want = dequantize_rows(q, s, ids, mult)
        assert got.dtype == want.dtype and got.shape == (3, 11, 29)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))   # bits, signed zeros too


@pytest.mark.parametrize("fmt", FORMATS)
def test_bfloat16_outputs_equal_the_definition_rounded_once(fmt, core):
    torch = pytest.importorskip("torch")
    q, s = _table(21, 17, fmt, "bfloat16")                                  # float32 scales holding bf16 values
    ids = np.random.default_rng(2).integers(0, 21, 40)
    bits = torch.from_numpy(s).bfloat16().view(torch.uint16).numpy()
    got = quantized_embedding(q, bits, ids, 3.0)
    want = torch.from_numpy(dequantize_rows(q, s, ids, 3.0)).bfloat16().view(torch.uint16).numpy()
    np.testing.assert_array_equal(got, want)


@st.composite
def cases(draw):
    V = draw(st.integers(1, 40))
    C = draw(st.integers(1, 70))
    shape = draw(st.sampled_from([(0,), (1,), (7,), (2, 5), (3, 1, 4), (0, 3)]))
    ids = draw(st.lists(st.integers(0, V - 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return (V, C, np.array(ids, np.int64).reshape(shape), draw(st.sampled_from(FORMATS)),
            draw(st.sampled_from([np.float16, np.float32, np.float64])), draw(st.floats(0.25, 64.0)),
            draw(st.integers(0, 10)))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_any_shape_and_ids(case):
    V, C, ids, fmt, scale_dtype, mult, seed = case
    q, s = _table(V, C, fmt, scale_dtype, seed)
    got = quantized_embedding(q, s, ids, mult)
    np.testing.assert_array_equal(got.view(np.uint8), dequantize_rows(q, s, ids, mult).view(np.uint8))


def test_writes_into_out_and_checks_it():
    q, s = _table(5, 4, "int8", np.float32)
    out = np.full((2, 4), np.nan, np.float32)
    assert quantized_embedding(q, s, [3, 0], 1.0, out=out) is out
    np.testing.assert_array_equal(out, dequantize_rows(q, s, np.array([3, 0]), 1.0))
    with pytest.raises(ConfigError, match="out must be"):
        quantized_embedding(q, s, [3, 0], out=np.empty((2, 4), np.float64))


def test_bad_ids_are_refused_by_value_and_never_read(core):
    q, s = _table(6, 3, "float8_e4m3fn", np.float32)
    for bad, text in (([1, 6], r"token id 6 at index \(1,\)"), ([-1, 2], r"token id -1 at index \(0,\)")):
        with pytest.raises(TokenIdError, match=text):
            quantized_embedding(q, s, bad)                                  # the checked API: before the kernel
        out = np.zeros((2, 3), np.float32)
        with pytest.raises(KernelBoundError, match="skipped 1 rows"):        # the unchecked entry: the kernel's bound
            gather_dequantized(q, s, np.array(bad), 1.0, out)
        good = 1 - bad.index(next(b for b in bad if b < 0 or b >= 6))       # the other row was written
        np.testing.assert_array_equal(out[good], dequantize_rows(q, s, np.array([bad[good]]), 1.0)[0])


def test_bad_arguments_are_named():
    q, s = _table(4, 3, "int8", np.float32)
    with pytest.raises(ConfigError, match="q must be"):
        quantized_embedding(q.astype(np.int16), s, [0])
    with pytest.raises(ConfigError, match="scale must be"):
        quantized_embedding(q, s[:3], [0])
    with pytest.raises(ConfigError, match="scale must be"):
        quantized_embedding(q, s.astype(np.int32), [0])
