"""The Triton 8-bit lookup (kernels.triton.quantized) against its definition (``dequantize_rows``), bit for bit:
int8 and float8 e4m3fn tables (every bit pattern decoded as torch decodes it), float32 / float16 / bfloat16 scales,
any ids shape; a bad id reads zeros, never foreign memory. On the CPU through Triton's interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton")          # the optional gpu extra

from tokenpos.kernels.triton.quantized import quantized_embedding  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402
from tokenpos.tables.formulas.quantize import dequantize_rows, quantize_rows  # noqa: E402

SCALES = [torch.float32, torch.float16, torch.bfloat16]
QDTYPES = {"int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}


def _table(V, C, fmt, sdt, device, seed=0):
    """(q, scale) on ``device`` and their NumPy forms (scales as float32 holding bf16 values for bfloat16)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((V, C)) * rng.uniform(0.01, 4.0, (V, 1))
    q, s = quantize_rows(w, str(sdt).removeprefix("torch."), fmt)
    qt = torch.from_numpy(q).view(QDTYPES[fmt]).to(device)
    return qt, torch.from_numpy(s).to(sdt).to(device), q, s


def _want(q, s, ids, mult, sdt):
    return torch.from_numpy(dequantize_rows(q, s, ids, mult)).to(sdt)


def _bits(t):
    return t.cpu().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("fmt", list(QDTYPES))
@pytest.mark.parametrize("sdt", SCALES)
def test_equals_the_definition_bit_for_bit(fmt, sdt, device):
    qt, st_, q, s = _table(33, 300, fmt, sdt, device)                     # two column blocks
    ids = np.random.default_rng(1).integers(0, 33, (3, 7))
    got = quantized_embedding(qt, st_, torch.from_numpy(ids).to(device), 1.7)
    assert got.dtype == sdt and got.shape == (3, 7, 300)
    assert torch.equal(_bits(got), _bits(_want(q, s, ids, 1.7, sdt)))


def test_every_e4m3_pattern_decodes_as_torch(device):
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(1, 256).view(torch.float8_e4m3fn).to(device)
    got = quantized_embedding(q, torch.ones(1, device=device), torch.zeros(1, dtype=torch.long, device=device), 1.0)
    want = q.cpu().float()
    assert torch.equal(got.cpu().isnan(), want.isnan())
    assert torch.equal(got.cpu().nan_to_num(0.5).view(torch.int32), want.nan_to_num(0.5).view(torch.int32))


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.sampled_from([(0,), (5,), (2, 3), (3, 1, 4)]),
       st.sampled_from(list(QDTYPES)), st.sampled_from(SCALES), st.integers(0, 5), st.booleans())
def test_any_shape_and_ids(V, C, shape, fmt, sdt, seed, int32):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    qt, st_, q, s = _table(V, C, fmt, sdt, device, seed)
    ids = np.random.default_rng(seed).integers(0, V, shape)
    t = torch.from_numpy(ids).to(torch.int32 if int32 else torch.int64).to(device)
    assert torch.equal(_bits(quantized_embedding(qt, st_, t, 2.0)), _bits(_want(q, s, ids, 2.0, sdt)))


def test_a_bad_id_reads_zeros(device):
    qt, st_, q, s = _table(4, 5, "int8", torch.float32, device)
    got = quantized_embedding(qt, st_, torch.tensor([1, 4, -1], device=device), 1.0).cpu()
    assert torch.equal(got[0], _want(q, s, np.array([1]), 1.0, torch.float32)[0])
    assert not got[1:].any()


def test_bad_arguments_are_named(device):
    qt, st_, _, _ = _table(4, 5, "int8", torch.float32, device)
    with pytest.raises(ConfigError, match="q must be"):
        quantized_embedding(qt.to(torch.int16), st_, torch.tensor([0], device=device), 1.0)
    with pytest.raises(ConfigError, match="scale must be"):
        quantized_embedding(qt, st_.double(), torch.tensor([0], device=device), 1.0)
