"""Both backends' RoPE-family layers accept and refuse the same settings with the same messages (shared checks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenpos.numpy.rope2d import RotaryEmbedding2D as NpRope2D
from tokenpos.numpy.xpos import XPosRotaryEmbedding as NpXPos
from tokenpos.tables import ConfigError
from tokenpos.torch.rope2d import RotaryEmbedding2D as TRope2D
from tokenpos.torch.xpos import XPosRotaryEmbedding as TXPos


def test_xpos_arguments():
    for layer in (NpXPos, TXPos):
        built = layer(8, rotary_dim=4, scale_base=256, center=3, interleaved=False)
        assert (built.rotary_dim, built.scale_base, built.center, built.interleaved) == (4, 256.0, 3.0, False)
        with pytest.raises(ConfigError, match="interleaved must be True or False, got 1"):
            layer(8, interleaved=1)
        with pytest.raises(ConfigError, match="rotary_dim must be an even number"):
            layer(8, rotary_dim=3)


class _Cfg:
    hidden_size, num_attention_heads = 64, 4

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_rope2d_from_hf_config():
    for layer in (NpRope2D, TRope2D):
        built = layer.from_hf_config(_Cfg(rope_parameters={"rope_theta": 7.0}))
        assert (built.head_dim, built.base) == (16, 7.0)
        with pytest.raises(ConfigError, match="2-D RoPE reads rope_parameters"):
            layer.from_hf_config(_Cfg(rope_parameters={"rope_type": "default"}))


def test_rope2d_bad_positions_same_message():
    q = np.zeros((2, 1, 3, 8))
    messages = []
    for layer, x in ((NpRope2D(8), q), (TRope2D(8), torch.from_numpy(q))):
        with pytest.raises(ConfigError) as err:
            layer.apply(x, x, np.zeros((4, 2), dtype=np.int64))
        messages.append(str(err.value))
    assert messages[0] == messages[1] == "positions must have shape (3, 2) or (2, 3, 2), got (4, 2)"
