"""from_hf for Llama-style causal LMs (small random configs): the token table equals embed_tokens and
``emb.position`` rotates q / k exactly as the model's own rotary module does."""

from __future__ import annotations

import pytest
import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables import ConfigError

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32, "rope_theta": 500000.0}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_llama_style_token_table_and_rotation(family: str) -> None:
    kw = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128}
    if family == "llama":
        cfg, cls = transformers.LlamaConfig(rope_parameters=ROPE, **kw), transformers.LlamaForCausalLM
    else:
        cfg, cls = transformers.Qwen2Config(**kw), transformers.Qwen2ForCausalLM
    torch.manual_seed(0)                                     # HF draws its init from the global generator
    model = cls(cfg).eval()
    emb = tpt.from_hf(model)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(emb(ids), model.model.embed_tokens(ids))
    assert emb.position.kind == "rotary"
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 1, 9, 16, generator=g)
    pos = torch.arange(40, 49)[None].expand(2, 9)
    cos, sin = model.model.rotary_emb(q, pos)
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = emb.position.apply(q, k, pos)
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * 48) * float(q.abs().max())
    assert float((got_q - want_q).abs().max()) <= bound and float((got_k - want_k).abs().max()) <= bound


def test_scaled_embedding_configs_are_refused() -> None:
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    model.config.embedding_multiplier = 12.0
    with pytest.raises(ConfigError, match="embedding_multiplier"):
        tpt.from_hf(model)
