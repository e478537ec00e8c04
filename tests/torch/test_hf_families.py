"""patch(model) on the families it recognises (not lists), each against the same HF model unpatched.

One tiny random model per family (fp32, 2 layers, hidden 32): logits equal to fp32 rounding, 8 greedy
tokens identical, tokenpos's RoPE op actually run, unpatch bit-identical, and ``angles="exact"`` either
equal to fp32 rounding or refused with the reason (model unchanged). The families of
``tests/torch/test_hf_patch.py`` (Llama, Mistral, Qwen2 / 3, Granite, Phi-3, Gemma 2 / 3, GPT-NeoX, GPT-J,
Llama 4, Qwen2-VL / 2.5-VL) run its full acceptance there. Then the refusals: a RoPE helper that is not
HF's code, rotary tables without the layout the helper reads, an input embedding patch cannot reproduce.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import pytest
import torch

from tests.torch.hf_models import assert_hf_close, compiled_patched, decoder_kwargs, eval_model, token_ids
from tokenpos.tables import ConfigError
from tokenpos.torch.hf import patch, unpatch
from tokenpos.torch.hf.families import recognise, same_function

transformers = pytest.importorskip("transformers")
T = transformers
V = 128
KW = decoder_kwargs(V, 32, 32, 2, 256)
MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16}
LINEAR = {"layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
          "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8}
MLA = {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
       "n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 1,
       "n_group": 1, "topk_group": 1}
IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

BUILD: dict[str, Any] = {
    "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**KW, head_dim=16, **MOE)),
    "qwen3_5_text": lambda: T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(**KW, head_dim=16, **LINEAR)),
    "qwen3_next": lambda: T.Qwen3NextForCausalLM(T.Qwen3NextConfig(
        **KW, head_dim=16, partial_rotary_factor=0.25, **LINEAR, **MOE, shared_expert_intermediate_size=16)),
    "glm4": lambda: T.Glm4ForCausalLM(T.Glm4Config(**KW, head_dim=16, partial_rotary_factor=0.5, **IDS)),
    "glm": lambda: T.GlmForCausalLM(T.GlmConfig(**KW, head_dim=16, **IDS)),
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**KW, **IDS)),
    "olmo3": lambda: T.Olmo3ForCausalLM(T.Olmo3Config(**KW, sliding_window=4, **IDS)),
    "smollm3": lambda: T.SmolLM3ForCausalLM(T.SmolLM3Config(**{**KW, "num_hidden_layers": 4},
                                                            no_rope_layer_interval=4, **IDS)),
    "ministral3": lambda: T.Ministral3ForCausalLM(T.Ministral3Config(**KW, head_dim=8, **IDS)),
    "cohere2": lambda: T.Cohere2ForCausalLM(T.Cohere2Config(
        **KW, sliding_window=4, layer_types=["sliding_attention", "full_attention"], **IDS)),
    "exaone4": lambda: T.Exaone4ForCausalLM(T.Exaone4Config(**KW, sliding_window=4, **IDS)),
    "seed_oss": lambda: T.SeedOssForCausalLM(T.SeedOssConfig(**KW, head_dim=8, **IDS)),
    "gemma4_text": lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(
        **KW, head_dim=16, global_head_dim=16, sliding_window=4, **IDS)),
    "deepseek_v3": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
        **{**KW, "num_key_value_heads": 4}, **MLA, **IDS)),                       # rope_interleave=True
    "deepseek_v3_halves": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
        **{**KW, "num_key_value_heads": 4}, **MLA, rope_interleave=False, **IDS)),
}
# rotary layers per model (NoPE layers and linear-attention layers call no RoPE helper)
ROPE_LAYERS = {"qwen3_5_text": 1, "qwen3_next": 1, "smollm3": 3}
# angles="exact" refused, with the reason: a rope config tokenpos's from_hf_config does not rebuild
# (Ministral 3 is rebuilt: YaRN, its llama_4_scaling_beta left to HF's attention, which applies it)
EXACT_REFUSED = {"qwen3_5_text": "M-RoPE with a partial rotary factor"}


def _model(name: str) -> Any:
    return eval_model(BUILD[name])


def _greedy(model: Any, ids: torch.Tensor) -> torch.Tensor:
    return model.generate(ids[:, :4], max_new_tokens=8, min_new_tokens=8, do_sample=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILD))
def test_a_recognised_family_patches_to_hf_logits_and_greedy_tokens(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    hp = importlib.import_module("tokenpos.torch.hf.rope_helpers")   # the replacements call the op
    calls: list[str] = []
    for op in ("rotate", "rotate_qk"):
        real = getattr(hp, op)
        monkeypatch.setattr(hp, op, lambda *a, _r=real, _n=op: calls.append(_n) or _r(*a))
    model = _model(name)
    ids = token_ids(1)
    emb = model.get_input_embeddings()
    rope_config = copy.deepcopy(model.config.to_dict())
    with torch.no_grad():
        want, want_tokens = model(ids).logits, _greedy(model, ids)
        assert not calls
        report = patch(model)
        assert report.rope_function is not None and report.rope_layers == ROPE_LAYERS.get(name, 2)
        got, got_tokens = model(ids).logits, _greedy(model, ids)
        assert calls                                          # tokenpos's op ran
        assert_hf_close(got, want)
        assert torch.equal(got_tokens, want_tokens)
        unpatch(model)
        assert torch.equal(model(ids).logits, want) and model.get_input_embeddings() is emb
        if name in EXACT_REFUSED:
            with pytest.raises(ConfigError, match=EXACT_REFUSED[name]):
                patch(model, angles="exact")
            assert not hasattr(model, "_tokenpos_patch") and model.get_input_embeddings() is emb
            assert not any("forward" in vars(m) for m in model.modules())
        else:
            report = patch(model, angles="exact")
            assert report.rotary_modules
            assert_hf_close(model(ids).logits, want)
            unpatch(model)
        assert torch.equal(model(ids).logits, want)
    assert model.config.to_dict() == rope_config


def test_recognition_reads_the_helpers_code_not_the_family_name() -> None:
    """Each reference helper is recognised as itself and as its copies in other modeling modules; helpers that
    compute something else (GLM's interleaved rotate_half against Llama's) are told apart."""
    from transformers.models.glm4 import modeling_glm4
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    assert same_function(modeling_qwen3_moe.apply_rotary_pos_emb, modeling_llama.apply_rotary_pos_emb)
    assert same_function(modeling_qwen3_moe.rotate_half, modeling_llama.rotate_half)
    assert not same_function(modeling_glm4.rotate_half, modeling_llama.rotate_half)
    assert not same_function(modeling_glm4.apply_rotary_pos_emb, modeling_llama.apply_rotary_pos_emb)
    family = recognise(_model("qwen3_moe"))
    assert family.module == modeling_qwen3_moe.__name__ and family.helpers == (("apply_rotary_pos_emb", "qk"),)


def _llama() -> Any:
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(**KW)).eval()


def test_a_rope_helper_that_is_not_hfs_code_is_refused_and_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper of the right name whose code differs (here: one extra scale) computes something else than the
    replacement would: refused by name, the model unchanged."""
    from transformers.models.llama import modeling_llama

    real = modeling_llama.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
        q, k = real(q, k, cos, sin, unsqueeze_dim)
        return q * 2, k

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    model = _llama()
    emb = model.get_input_embeddings()
    with pytest.raises(ConfigError, match=r"LlamaAttention: it calls apply_rotary_pos_emb .*none of HF's RoPE"):
        patch(model)
    assert model.get_input_embeddings() is emb and not hasattr(model, "_tokenpos_patch")
    assert not any("forward" in vars(m) for m in model.modules())


def test_rotary_tables_without_the_layout_the_helper_reads_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's helper with cos / sin whose halves differ (not [c, c]) is no rotation the op can compute: the
    probe of the rotary module finds it, and patch refuses before any change."""
    from transformers.models.llama import modeling_llama

    def forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, 2 * freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", forward)
    model = _llama()
    emb = model.get_input_embeddings()
    with pytest.raises(ConfigError, match=r"model\.rotary_emb \(LlamaRotaryEmbedding\).*'halves' layout"):
        patch(model)
    assert model.get_input_embeddings() is emb and not hasattr(model, "_tokenpos_patch")


def test_an_input_embedding_patch_cannot_reproduce_is_refused_and_rope_alone_patches() -> None:
    class Doubled(torch.nn.Embedding):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return super().forward(ids) * 2

    model = _llama()
    weight = model.get_input_embeddings().weight
    own = Doubled(V, KW["hidden_size"])
    own.weight = weight
    model.set_input_embeddings(own)
    ids = token_ids(2)
    with torch.no_grad():
        want = model(ids).logits
        with pytest.raises(ConfigError, match=r"input embedding is a Doubled.*pass embedding=False"):
            patch(model)
        assert model.get_input_embeddings() is own and not any("forward" in vars(m) for m in model.modules())
        report = patch(model, embedding=False)
        assert report.embedding is None and report.rope_layers == KW["num_hidden_layers"]
        assert_hf_close(model(ids).logits, want)
        unpatch(model)


@pytest.mark.slow
def test_torch_compile_of_a_patched_mla_model_is_one_graph() -> None:
    """DeepSeek V3 (two helpers replaced, one of them de-interleaving) under ``fullgraph=True``: one graph
    holding tokenpos's rope_qk, the module's globals read live (the aliases are ordinary module globals)."""
    model = _model("deepseek_v3")
    got, want, targets = compiled_patched(model, token_ids(4))
    assert any("tokenpos.rope_qk" in t for t in targets)
    assert_hf_close(got, want)


def test_exact_angles_that_would_differ_from_the_models_own_tables_are_refused() -> None:
    """The rebuilt tables are checked against the model's rotary module: a model whose inv_freq is not what
    its config says (here: changed by hand) is refused for angles="exact", unchanged, and patches with "hf"."""
    model = _llama()
    model.model.rotary_emb.inv_freq.mul_(1.01)
    rotary = model.model.rotary_emb
    with pytest.raises(ConfigError, match=r"rebuilds the LlamaRotaryEmbedding .* differently from HF: max difference"):
        patch(model, angles="exact")
    assert model.model.rotary_emb is rotary and not hasattr(model, "_tokenpos_patch")
    assert not any("forward" in vars(m) for m in model.modules())
    ids = token_ids(3)
    with torch.no_grad():
        want = model(ids).logits
        patch(model)
        assert_hf_close(model(ids).logits, want)
    unpatch(model)
