"""RotaryEmbedding.from_hf_config against the Hugging Face models themselves (small random configs):
GPT-J (rotary_dim 8, interleaved) and an older GPT-NeoX dict (rotary_pct, rotary_emb_base) through
the models' own logits, Gemma 3's per-layer-type rotary module, Gemma 4 style p-RoPE, and the
(B, L, H, Dh) layout against HF's ``apply_rotary_pos_emb(..., unsqueeze_dim=2)``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.tolerances import TOL
from tokenpos.torch import RotaryEmbedding

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

LOGITS_ATOL = 1e-5          # float32 logits of a 1-layer model, our float64 angles vs HF's float32 ones


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _rope_err(cos_hf: torch.Tensor, ours: torch.Tensor, max_pos: int) -> None:
    tol = TOL["hf.rope_rotated"]
    bound = tol["atol"] + tol["per_position"] * max_pos
    assert float((cos_hf.double() - ours.double()).abs().max()) <= bound


@pytest.mark.slow  # a whole HF model
def test_gptj_logits_with_our_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = transformers.GPTJConfig(vocab_size=50, n_positions=32, n_embd=64, n_layer=1, n_head=4, rotary_dim=8)
    torch.manual_seed(0)                                   # HF draws its init from the global generator
    model = transformers.GPTJForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    want = _logits(model, ids)
    rope = RotaryEmbedding.from_hf_config(cfg, qk_layout="blhd")
    assert (rope.head_dim, rope.rotary_dim, rope.interleaved) == (16, 8, True)

    def ours(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, use: RotaryEmbedding = rope) -> torch.Tensor:
        r = tensor.shape[-1]                               # HF passes the first rotary_dim features of each head
        full = torch.cat([tensor, tensor.new_zeros(*tensor.shape[:-1], use.head_dim - r)], dim=-1)
        return use.rotate(full)[..., :r]

    monkeypatch.setattr(modeling_gptj, "apply_rotary_pos_emb", ours)
    assert float((_logits(model, ids) - want).abs().max()) <= LOGITS_ATOL
    wrong = RotaryEmbedding(16, qk_layout="blhd")          # what the old reading built: R = 16, half layout
    monkeypatch.setattr(modeling_gptj, "apply_rotary_pos_emb", lambda t, s, c: ours(t, s, c, wrong))
    assert float((_logits(model, ids) - want).abs().max()) > 1e-3


@pytest.mark.slow  # a whole HF model
def test_old_neox_dict_logits_with_our_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    d = {"vocab_size": 50, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 64, "rotary_pct": 0.25, "rotary_emb_base": 20000}
    cfg = transformers.GPTNeoXConfig(**d)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(1))
    want = _logits(model, ids)
    rope = RotaryEmbedding.from_hf_config(d)               # the config.json dict, as a user would load it
    assert (rope.rotary_dim, rope.base) == (8, 20000.0)

    def ours(q, k, cos, sin, unsqueeze_dim=1, use=rope):   # noqa: ANN001
        return use.apply(q, k)

    monkeypatch.setattr(modeling_gpt_neox, "apply_rotary_pos_emb", ours)
    assert float((_logits(model, ids) - want).abs().max()) <= LOGITS_ATOL
    wrong = RotaryEmbedding(32)                            # the old reading: rotary_dim 32 (= Dh), base 10000
    monkeypatch.setattr(modeling_gpt_neox, "apply_rotary_pos_emb",
                        lambda q, k, c, s, unsqueeze_dim=1: wrong.apply(q, k))
    assert float((_logits(model, ids) - want).abs().max()) > 1e-3


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 8.0}])
@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_gemma3_per_layer_type_matches_hf_rotary_module(layer_type: str, scaling: Any) -> None:
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    kw = {} if scaling is None else {"rope_scaling": scaling}
    cfg = transformers.Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                        max_position_embeddings=4096, sliding_window=16,
                                        layer_types=["sliding_attention", "full_attention"], **kw)
    pos = torch.tensor([[0, 1, 2, 17, 1000, 4095]])
    cos_hf, sin_hf = Gemma3RotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), pos, layer_type)
    rope = RotaryEmbedding.from_hf_config(cfg, layer_type=layer_type)
    cos, sin = rope.cos_sin_positions(pos)
    _rope_err(cos_hf, cos, 4095)
    _rope_err(sin_hf, sin, 4095)
    other = "full_attention" if layer_type == "sliding_attention" else "sliding_attention"
    cos_other, _ = RotaryEmbedding.from_hf_config(cfg, layer_type=other).cos_sin_positions(pos)
    assert float((cos_other - cos).abs().max()) > 0.1       # the two layer types really differ


def test_proportional_matches_hf_gemma4_style_rotation() -> None:
    cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=512,
                                   rope_parameters={"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1e6})
    hf = modeling_llama.LlamaRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 9, 64, generator=g), torch.randn(2, 1, 9, 64, generator=g)
    pos = torch.arange(100, 109)[None].expand(2, 9)
    cos, sin = hf(q, pos)
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding.from_hf_config(cfg)
    assert rope.rotary_dim == 64 and torch.count_nonzero(rope.inv_freq) == 8
    got_q, got_k = rope.apply(q, k, pos)
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * 108) * float(q.abs().max())
    assert float((got_q - want_q).abs().max()) <= bound and float((got_k - want_k).abs().max()) <= bound
    assert torch.equal(got_q[..., 8:32], q[..., 8:32])     # the zero-frequency pairs pass through


def test_blhd_layout_matches_hf_unsqueeze_dim_2() -> None:
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64,
                                   rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                    "original_max_position_embeddings": 16})
    hf = modeling_llama.LlamaRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 7, 4, 16, generator=g), torch.randn(2, 7, 2, 16, generator=g)     # (B, L, H, Dh)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 50]])                                            # (1, L), as HF passes
    cos, sin = hf(q, pos)
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    rope = RotaryEmbedding.from_hf_config(cfg, qk_layout="blhd", num_heads=4)
    got_q, got_k = rope.apply(q, k, pos)
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * 50) * float(q.abs().max())
    assert got_q.shape == q.shape and float((got_q - want_q).abs().max()) <= bound
    assert float((got_k - want_k).abs().max()) <= bound
    np.testing.assert_array_equal(rope.rotate(q, pos).numpy(), got_q.numpy())
