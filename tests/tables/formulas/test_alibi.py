"""tables.formulas.alibi: slopes (powers of two and not) against the paper's formula and HF Bloom; the bias."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, alibi_bias, alibi_slopes

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402


def paper_slopes(n: int) -> list[float]:
    """ofirpress/attention_with_linear_biases, written out."""
    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64, 80])
def test_slopes_match_paper_and_bloom(num_heads: int) -> None:
    ours = alibi_slopes(num_heads)
    assert ours.shape == (num_heads,) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, paper_slopes(num_heads), rtol=1e-14)
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1].numpy()
    np.testing.assert_allclose(ours, bloom, **TOL["hf.alibi_slopes"])


def test_known_values() -> None:
    np.testing.assert_array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_array_equal(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])   # 4 + odd of 8
    np.testing.assert_allclose(alibi_slopes(16)[:2], [2**-0.5, 2**-1], rtol=1e-15)


@pytest.mark.parametrize("num_heads", [6, 8, 12, 16, 20])
def test_bias_equals_bloom_up_to_a_row_constant(num_heads: int) -> None:
    length = 9
    ours = alibi_bias(num_heads, length, length)                                  # (H, L, L)
    bloom = build_alibi_tensor(torch.ones(1, length), num_heads, torch.float32)[:, 0, :].numpy()   # (H, L)
    slopes = alibi_slopes(num_heads)
    causal = np.tril(np.ones((length, length), dtype=bool))
    shifted = ours + slopes[:, None, None] * np.arange(length)[None, :, None]     # + m_h * q_pos
    expected = np.broadcast_to(bloom[:, None, :], ours.shape)
    np.testing.assert_allclose(shifted[:, causal], expected[:, causal], rtol=TOL["hf.alibi_slopes"]["rtol"],
                               atol=1e-12)


def test_bias_with_cache_offset_and_symmetry() -> None:
    full = alibi_bias(4, 10, 10)
    np.testing.assert_array_equal(alibi_bias(4, 3, 10), full[:, 7:])             # queries are the last Lq
    np.testing.assert_array_equal(full, full.transpose(0, 2, 1))
    assert np.all(np.diagonal(full, axis1=1, axis2=2) == 0) and np.all(full <= 0)
    assert alibi_bias(3, 0, 0).shape == (3, 0, 0)
    with pytest.raises(ConfigError, match="q_len 5 is greater than k_len 3"):
        alibi_bias(2, 5, 3)
    with pytest.raises(ConfigError, match="num_heads"):
        alibi_slopes(0)
