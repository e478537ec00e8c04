"""tables.formulas.t5: buckets against HF's T5Attention._relative_position_bucket, exactly, over a wide range."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpos.tables import ConfigError, t5_bias, t5_bias_backward, t5_bucket_matrix, t5_relative_bucket
from tokenpos.tables.formulas.t5 import t5_relative_positions

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

REL = np.arange(-3000, 3001)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (8, 20), (64, 256), (33, 100),
                                                           (4, 5), (128, 2048)])
def test_buckets_equal_hf(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    ours = t5_relative_bucket(REL, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    hf = T5Attention._relative_position_bucket(torch.from_numpy(REL), bidirectional=bidirectional,
                                               num_buckets=num_buckets, max_distance=max_distance).numpy()
    np.testing.assert_array_equal(ours, hf)
    assert ours.min() >= 0 and ours.max() < num_buckets


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.integers(0, 20), st.booleans())
def test_bucket_matrix_equals_hf_compute_bias_positions(q_len: int, extra: int, past: int, bidirectional: bool) -> None:
    k_len = q_len + extra
    ours = t5_bucket_matrix(q_len, k_len, bidirectional=bidirectional, query_offset=past)
    context = torch.arange(q_len)[:, None] + past
    rel = torch.arange(k_len)[None, :] - context                     # HF compute_bias, past_seen_tokens=past
    hf = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional).numpy()
    np.testing.assert_array_equal(ours, hf)


def test_default_offset_is_cache_convention() -> None:
    np.testing.assert_array_equal(t5_relative_positions(2, 5), [[-3, -2, -1, 0, 1], [-4, -3, -2, -1, 0]])
    np.testing.assert_array_equal(t5_bucket_matrix(3, 9), t5_bucket_matrix(3, 9, query_offset=6))
    with pytest.raises(ConfigError, match="greater than k_len"):
        t5_bucket_matrix(4, 2)


def test_unidirectional_future_is_bucket_zero() -> None:
    b = t5_relative_bucket(np.arange(0, 50), bidirectional=False)
    assert np.all(b[0] == 0) and np.all(b == 0)


def test_gather_and_its_backward() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((32, 3))
    buckets = t5_bucket_matrix(4, 6)
    bias = t5_bias(weight, buckets)
    assert bias.shape == (3, 4, 6)
    np.testing.assert_array_equal(bias[1, 2, 5], weight[buckets[2, 5], 1])
    g = rng.standard_normal(bias.shape)
    ref = np.zeros_like(weight)
    np.add.at(ref, buckets.reshape(-1), np.moveaxis(g, 0, -1).reshape(-1, 3))
    np.testing.assert_allclose(t5_bias_backward(g, buckets, 32), ref, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(("kwargs", "needle"), [({"num_buckets": 2}, "num_buckets"),
                                                ({"max_distance": 4}, "max_distance"),
                                                ({"bidirectional": 1}, "bidirectional")])
def test_bad_config(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        t5_relative_bucket(np.arange(3), **kwargs)
    with pytest.raises(ConfigError, match="integers"):
        t5_relative_bucket(np.arange(3.0))
