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


SCALED = {
    "gemma": lambda kw: transformers.GemmaForCausalLM(transformers.GemmaConfig(**kw, head_dim=16)),
    "gemma2": lambda kw: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**kw, head_dim=16)),
    "granite": lambda kw: transformers.GraniteForCausalLM(transformers.GraniteConfig(**kw, embedding_multiplier=0.1)),
    "granitemoe": lambda kw: transformers.GraniteMoeForCausalLM(transformers.GraniteMoeConfig(
        **kw, embedding_multiplier=12.1, num_local_experts=2, num_experts_per_tok=1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(SCALED))
def test_scaled_embeddings_equal_what_the_first_layer_receives(family: str, dtype: torch.dtype) -> None:
    """Gemma's embed_scale (rounded to the weight dtype) and Granite's embedding_multiplier, checked
    against HF itself: the hidden states its first decoder layer receives."""
    kw = {"vocab_size": 50, "hidden_size": 48, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 3, "num_key_value_heads": 1, "max_position_embeddings": 128}
    torch.manual_seed(0)
    model = SCALED[family](kw).to(dtype).eval()
    seen: list[torch.Tensor] = []
    model.model.layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).detach()), with_kwargs=True)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    emb = tpt.from_hf(model)
    with torch.no_grad():
        model(ids)
        got = emb(ids)
    assert emb.token.multiplier != 1.0 and got.dtype == dtype
    assert torch.equal(got, seen[0])
