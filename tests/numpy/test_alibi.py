"""tokenpos.numpy.ALiBi: the bias module (shapes, dtype, offsets, no parameters)."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.numpy.alibi import ALiBi
from tokenpos.tables import ConfigError, alibi_bias, alibi_slopes


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("num_heads", [6, 8, 12, 16, 20])
def test_bias_is_the_table_cast(dtype, num_heads: int) -> None:
    layer = ALiBi(num_heads, dtype=dtype)
    out = layer.bias(5, 9)
    assert out.shape == (num_heads, 5, 9) and out.dtype == dtype
    np.testing.assert_array_equal(out, alibi_bias(num_heads, 5, 9).astype(dtype))
    np.testing.assert_array_equal(layer.slopes, alibi_slopes(num_heads))
    np.testing.assert_array_equal(layer(5, 9), out)


def test_distance_convention() -> None:
    b = ALiBi(8, dtype=np.float64).bias(2, 4)
    np.testing.assert_allclose(b[0], -0.5 * np.array([[2, 1, 0, 1], [3, 2, 1, 0]]))


def test_no_parameters_and_errors() -> None:
    layer = ALiBi(4)
    assert layer.kind == "bias" and layer.parameters() == [] and layer.state_dict() == {}
    assert layer.backward(np.zeros((4, 2, 2))) is None
    with pytest.raises(ConfigError, match="greater than k_len"):
        layer.bias(3, 2)
    with pytest.raises(ConfigError, match="num_heads"):
        ALiBi(0)
    with pytest.raises(ConfigError, match="dtype"):
        ALiBi(2, dtype=np.int32)
