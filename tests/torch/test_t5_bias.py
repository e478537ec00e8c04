"""tokenpos.torch.T5RelativePositionBias against HF T5Attention.compute_bias with the same weights."""

from __future__ import annotations

import pytest
import torch

from tokenpos.tables import ConfigError
from tokenpos.torch.t5_bias import T5RelativePositionBias

pytest.importorskip("transformers")
from transformers import T5Config  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402


def hf_attention(is_decoder: bool, num_buckets: int = 32, max_distance: int = 128) -> T5Attention:
    cfg = T5Config(d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=num_buckets,
                   relative_attention_max_distance=max_distance, is_decoder=is_decoder)
    return T5Attention(cfg, has_relative_attention_bias=True).eval()


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 16)])
@pytest.mark.parametrize(("q_len", "k_len", "past"), [(7, 7, 0), (1, 300, 299), (3, 9, 6), (5, 5, 0)])
def test_bias_equals_hf_compute_bias(is_decoder: bool, num_buckets: int, max_distance: int, q_len: int,
                                     k_len: int, past: int) -> None:
    hf = hf_attention(is_decoder, num_buckets, max_distance)
    ours = T5RelativePositionBias(4, bidirectional=not is_decoder, num_buckets=num_buckets,
                                  max_distance=max_distance, seed=0)
    ours.load_state_dict({"weight": hf.relative_attention_bias.weight.detach().clone()})
    ref = hf.compute_bias(q_len, k_len, past_seen_tokens=past)[0]                  # (H, Lq, Lk)
    torch.testing.assert_close(ours(q_len, k_len), ref, rtol=0, atol=0)
    torch.testing.assert_close(ours(q_len, k_len, query_offset=past), ref, rtol=0, atol=0)


def test_gradient_and_compile() -> None:
    layer = T5RelativePositionBias(3, num_buckets=8, max_distance=10, seed=0)
    layer(4, 6).sum().backward()
    assert layer.weight.grad is not None and float(layer.weight.grad.sum()) == 3 * 4 * 6
    torch._dynamo.reset()
    compiled = torch.compile(lambda: layer(3, 500), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(), layer(3, 500), rtol=0, atol=0)


def test_state_dict_dtype_and_errors() -> None:
    layer = T5RelativePositionBias(2, dtype=torch.bfloat16, seed=1)
    assert list(layer.state_dict()) == ["weight"] and layer.weight.shape == (32, 2)
    assert layer(2, 2).dtype == torch.bfloat16 and layer.kind == "bias"
    with pytest.raises(ConfigError, match="greater than k_len"):
        layer(3, 2)
    with pytest.raises(ConfigError, match="max_distance"):
        T5RelativePositionBias(2, max_distance=3)
