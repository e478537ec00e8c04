"""tables.checks.rope / checks.rotary_layers: the checks both backends' RoPE-family layers share."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpos.tables import ConfigError
from tokenpos.tables.checks.rope import check_positions_shape, check_qk_lengths, rope_positions_message
from tokenpos.tables.checks.rotary_layers import check_rope2d_positions_shape, xpos_layer_args
from tokenpos.tables.formulas.rope2d import rope2d_layer_args
from tokenpos.tables.hf.models import rope2d_args_from_hf_config


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_positions_shape_accepts_exactly_l_1l_bl(batch, length, shape):
    shape = tuple(shape)
    allowed = {(length,), (1, length), (batch, length)}
    if shape in allowed:
        assert check_positions_shape(shape, batch, length) is (shape == (1, length))
    else:
        with pytest.raises(ConfigError) as err:
            check_positions_shape(shape, batch, length)
        assert str(err.value) == rope_positions_message(shape, batch, length)


def test_qk_lengths():
    check_qk_lengths((2, 4, 3, 8), (2, 1, 3, 8))                   # heads may differ (GQA)
    with pytest.raises(ConfigError, match=r"same batch and length.*\(2, 4, 3, 8\).*\(2, 4, 5, 8\)"):
        check_qk_lengths((2, 4, 3, 8), (2, 4, 5, 8))


@pytest.mark.parametrize("shape", [(5, 2), (1, 5, 2), (3, 5, 2)])
def test_rope2d_positions_shape_ok(shape):
    check_rope2d_positions_shape(shape, 3, 5)


@pytest.mark.parametrize("shape", [(5,), (4, 2), (5, 3), (2, 5, 2), (1, 1, 5, 2)])
def test_rope2d_positions_shape_refused(shape):
    with pytest.raises(ConfigError, match=r"positions must have shape \(5, 2\) or \(3, 5, 2\), got "):
        check_rope2d_positions_shape(shape, 3, 5)


def test_rope2d_args():
    head_dim, base, inv, axis = rope2d_layer_args(8, 100)
    assert (head_dim, base) == (8, 100.0) and inv.shape == axis.shape == (4,)
    with pytest.raises(ConfigError, match="divisible by 4"):
        rope2d_layer_args(6, 100)


def test_xpos_args():
    assert xpos_layer_args(8, None, 512, None, True) == (8, 8, 512.0, None, True)
    assert xpos_layer_args(8, 4, 256.0, 3, np.bool_(False), bool_types=(bool, np.bool_)) == (8, 4, 256.0, 3.0, False)
    with pytest.raises(ConfigError, match="interleaved must be True or False, got 1"):
        xpos_layer_args(8, None, 512, None, 1)


def test_rope2d_hf_config_args():
    assert rope2d_args_from_hf_config(_Cfg(rope_parameters={"rope_type": "axial", "rope_theta": 50.0})) == (16, 50.0)
    assert rope2d_args_from_hf_config(_Cfg(head_dim=8)) == (8, 10000.0)
    with pytest.raises(ConfigError, match="2-D RoPE reads rope_parameters"):
        rope2d_args_from_hf_config(_Cfg(rope_parameters={"rope_type": "default"}))


class _Cfg:
    hidden_size, num_attention_heads = 64, 4

    def __init__(self, **kw):
        self.__dict__.update(kw)
