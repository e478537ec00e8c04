"""Llama 4 (iRoPE) against HF's Llama4TextAttention (small config): the NoPE layer pattern and the attention
temperature option of both backends' attention functions; NumPy backward by finite differences; parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.numpy.gradcheck import check_grads
from tests.parity.helpers import assert_fn_parity
from tokenpos.numpy.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from tokenpos.tables import ConfigError
from tokenpos.tables.formulas.llama4 import llama4_attn_scales, llama4_rope_layers
from tokenpos.tables.hf.models import llama4_kwargs_from_hf_config
from tokenpos.torch import RotaryEmbedding
from tokenpos.torch.attention import scaled_dot_product_attention

transformers = pytest.importorskip("transformers")
from transformers.models.llama4 import modeling_llama4 as l4  # noqa: E402


def _config(**kw):  # noqa: ANN003, ANN202
    return transformers.Llama4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                                         intermediate_size_mlp=32, num_hidden_layers=8, num_attention_heads=2,
                                         num_key_value_heads=2, head_dim=16, floor_scale=4, attn_scale=0.5,
                                         use_qk_norm=False, **kw)


def test_rope_layer_pattern_matches_hf() -> None:
    cfg = _config()
    assert llama4_rope_layers(8) == [bool(f) for f in cfg.no_rope_layers]
    assert llama4_kwargs_from_hf_config(cfg)["rope_layers"] == [True, True, True, False] * 2
    assert llama4_kwargs_from_hf_config(cfg)["attn_temperature"] == (4.0, 0.5)
    with pytest.raises(ConfigError, match="no_rope_layers"):
        llama4_rope_layers(3, no_rope_layers=[1, 0])


@pytest.mark.parametrize("layer_idx", [2, 3])          # 2: a RoPE layer, 3: a NoPE layer with temperature
def test_attention_matches_hf_llama4_text_attention(layer_idx: int) -> None:
    cfg = _config()
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)                              # HF draws its init from the global generator
    attn = l4.Llama4TextAttention(cfg, layer_idx).eval()
    rotary = l4.Llama4TextRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(1)
    length = 23                                       # positions past floor_scale: temperatures 1 .. 1 + 0.5 log 7
    h = torch.randn(1, length, 32, generator=g)
    pos = torch.arange(length)[None]
    with torch.no_grad():
        want, _ = attn(h, rotary(h, pos), attention_mask=None)
        q = attn.q_proj(h).view(1, length, 2, 16).transpose(1, 2)
        k = attn.k_proj(h).view(1, length, 2, 16).transpose(1, 2)
        v = attn.v_proj(h).view(1, length, 2, 16).transpose(1, 2)
        kw = llama4_kwargs_from_hf_config(cfg)
        uses_rope = kw["rope_layers"][layer_idx]
        positional = RotaryEmbedding.from_hf_config(cfg) if uses_rope else None
        out = scaled_dot_product_attention(q, k, v, positional=positional, causal=False,
                                           attn_temperature=None if uses_rope else kw["attn_temperature"])
        got = attn.o_proj(out.transpose(1, 2).reshape(1, length, 32))
        plain = attn.o_proj(scaled_dot_product_attention(q, k, v, causal=False).transpose(1, 2).reshape(1, length, 32))
    assert float((got - want).abs().max()) <= 1e-5
    if not uses_rope:                                 # the temperature really matters here
        assert float((plain - want).abs().max()) > 1e-3


def test_temperature_values() -> None:
    s = llama4_attn_scales(np.array([0, 2, 3, 7, 8191, 8192 * 3 - 1]), floor_scale=8192, attn_scale=0.1)
    np.testing.assert_allclose(s, [1, 1, 1, 1, 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(4)], rtol=1e-15)


def _inputs(seed: int = 0, dtype=np.float64):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((2, 2, n, 8)).astype(dtype) for n in (4, 6, 6))


@pytest.mark.parametrize("positions", [None, np.array([0, 5, 9, 30])])
def test_numpy_backward_with_temperature_finite_differences(positions) -> None:  # noqa: ANN001
    q, k, v = _inputs()
    x = np.concatenate([q, k[:, :, :4], v[:, :, :4]], axis=0)        # keep one array for the checker

    class Layer:
        def named_parameters(self):  # noqa: ANN202
            return []

    def run(layer, xx):  # noqa: ANN001, ANN202
        out, layer.cache = scaled_dot_product_attention_forward(xx[:2], xx[2:4], xx[4:], causal=True,
                                                                positions=positions, attn_temperature=(2, 0.7))
        return out

    def backward(layer, g):  # noqa: ANN001, ANN202
        return np.concatenate(scaled_dot_product_attention_backward(g, layer.cache), axis=0)

    check_grads(Layer, x, run=run, backward=backward, x_is_float=True, tol="fd.nonlinear")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_torch_parity_with_temperature(dtype) -> None:  # noqa: ANN001
    q, k, v = _inputs(1, dtype)
    saved = {}

    def np_call(a, b, c):  # noqa: ANN001, ANN202
        out, saved["cache"] = scaled_dot_product_attention_forward(a, b, c, start_pos=5, attn_temperature=(3, 0.4))
        return out

    assert_fn_parity(np_call, lambda g: scaled_dot_product_attention_backward(g, saved["cache"]),
                     lambda a, b, c: scaled_dot_product_attention(a, b, c, start_pos=5, attn_temperature=(3, 0.4)),
                     (q, k, v))
