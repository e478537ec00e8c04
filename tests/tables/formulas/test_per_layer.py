"""tables.formulas.per_layer: HF's per-layer scale for every table dtype, and the out-of-range id mapping."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.per_layer import per_layer_multiplier, round_to_bfloat16, zero_out_of_range
from tokenpos.tables.formulas.quantize import dequantize_rows, quantize_rows

torch = pytest.importorskip("torch")

DIMS = [1, 2, 3, 5, 12, 64, 128, 200, 256, 511, 1536, 3072]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_multiplier_is_hfs_embed_scale_buffer_cast_to_the_table_dtype(dtype):
    """HF: ``nn.Buffer(torch.tensor(P ** 0.5))`` (float32), then ``.to(W.dtype)`` in the forward."""
    for dim in DIMS:
        hf = float(torch.tensor(dim ** 0.5).to(getattr(torch, dtype)))
        assert per_layer_multiplier(dim, dtype) == hf, (dim, dtype)


def test_the_bfloat16_rounding_is_torchs_cast_ties_to_even_included():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(0.0, 100.0, 2000), rng.standard_normal(2000) * 1e3,
                             # exact ties between two bfloat16 values: the even one wins
                             np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 255.5, 256.0 + 1.0, -(1.0 + 2.0 ** -8)])])
    for v in values:
        want = float(torch.tensor(float(v), dtype=torch.float32).to(torch.bfloat16))
        assert round_to_bfloat16(float(v)) == want, v


def test_bad_arguments_are_named():
    with pytest.raises(ConfigError, match="dim"):
        per_layer_multiplier(0, "float32")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        per_layer_multiplier(4, "int8")


def test_zero_out_of_range_maps_ids_past_the_table_and_nothing_else():
    ids = np.array([[0, 5, 6, 100], [-1, 5, 2, 7]])
    got = zero_out_of_range(ids, 6)
    np.testing.assert_array_equal(got, [[0, 5, 0, 0], [-1, 5, 2, 0]])     # negatives left for the check
    assert got.dtype == ids.dtype
    assert zero_out_of_range(np.array([3, 2 ** 64 - 1], dtype=np.uint64), 4).tolist() == [3, 0]
    np.testing.assert_array_equal(zero_out_of_range([9, 1], 4), [0, 1])
    assert zero_out_of_range([], 4).dtype == np.int64
    floats = np.array([1.0, 9.0])
    assert zero_out_of_range(floats, 4) is floats                            # left for the check to refuse


def test_quantize_rows_is_symmetric_per_row_int8_with_half_even_rounding():
    w = np.array([[0.0, 0.0, 0.0], [1.27, -0.635, 0.005], [-2.54, 1.0, 0.0]])
    q, s = quantize_rows(w)
    assert q.dtype == np.int8 and s.dtype == np.float32
    np.testing.assert_array_equal(s, np.float32([0.0, 0.01, 0.02]))
    expected = np.rint(w[1:] / s[1:, None].astype(np.float64))
    np.testing.assert_array_equal(q, np.vstack([[0, 0, 0], expected]).astype(np.int8))
    assert q[2, 0] == -127 and np.abs(q).max() == 127
    q16, s16 = quantize_rows(w, np.float16)
    assert s16.dtype == np.float16
    np.testing.assert_array_equal(q16[1:], np.rint(w[1:] / s16[1:, None].astype(np.float64)).astype(np.int8))


def test_dequantize_rows_reads_only_the_ids_rows():
    q = np.array([[1, -2], [127, -127], [3, 0]], dtype=np.int8)
    s = np.array([0.5, 0.25, 2.0], dtype=np.float32)
    got = dequantize_rows(q, s, np.array([[2, 1]]), 3.0)
    np.testing.assert_array_equal(got, np.float32([[[18.0, 0.0], [95.25, -95.25]]]))
    assert got.dtype == np.float32
