"""patch(model) / unpatch(model) against the unpatched Hugging Face model itself (tiny random configs).

One helper (:func:`_check_family`) runs every acceptance check on one model: eval and train logits,
left padding, packed positions, a KV-cache step, 32 greedy tokens, a training step's gradients,
tied heads, and unpatch's bit-identical restore.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.torch.hf_models import assert_hf_close, compiled_patched, decoder_kwargs, eval_model, token_ids
from tokenpos.tables import ConfigError
from tokenpos.torch.hf import PatchReport, patch, unpatch
from tokenpos.torch.hf.embedding import SharedTokenEmbedding
from tokenpos.torch.hf.families import recognise
from tokenpos.torch.hf.patch import ExactAngles

transformers = pytest.importorskip("transformers")
T = transformers
V = 128
KW = decoder_kwargs(V, 64, 64, 2, 256)
MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
VISION = {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "out_hidden_size": 64,
          "intermediate_size": 32}
VL_IDS = {"vocab_size": V, "image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122}


def _vl(cfg_cls: Any, model_cls: Any) -> Any:
    return model_cls(cfg_cls(text_config={**KW, "rope_parameters": MROPE}, vision_config=VISION, **VL_IDS))


BUILD: dict[str, Any] = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**KW, tie_word_embeddings=True)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**KW)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**KW)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**KW, head_dim=16)),
    "granite": lambda: T.GraniteForCausalLM(T.GraniteConfig(**KW, embedding_multiplier=3.0, residual_multiplier=0.5,
                                                            logits_scaling=2.0)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**KW, head_dim=16, sliding_window=8)),
    "gemma3_text": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(**KW, head_dim=16, sliding_window=8)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**KW, partial_rotary_factor=0.5, pad_token_id=0)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        rotary_pct=0.25, max_position_embeddings=256)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(vocab_size=V, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                   n_positions=256, bos_token_id=0, eos_token_id=0)),
    "llama4_text": lambda: T.Llama4ForCausalLM(T.Llama4TextConfig(
        **KW, head_dim=16, intermediate_size_mlp=64, num_local_experts=2, attn_temperature_tuning=True,
        floor_scale=4, no_rope_layers=[1, 0], eos_token_id=0)),
    "gemma3": lambda: T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        text_config={**KW, "head_dim": 16, "sliding_window": 8},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 3, eoi_token_index=V - 2)),
    "qwen2_vl": lambda: _vl(T.Qwen2VLConfig, T.Qwen2VLForConditionalGeneration),
    "qwen2_5_vl": lambda: _vl(T.Qwen2_5_VLConfig, T.Qwen2_5_VLForConditionalGeneration),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "bert": lambda: T.BertForMaskedLM(T.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=64)),
    "roberta": lambda: T.RobertaForMaskedLM(T.RobertaConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                            num_attention_heads=4, intermediate_size=64)),
}
CAUSAL = [k for k in BUILD if k not in ("bert", "roberta")]


def _model(name: str) -> Any:
    return eval_model(BUILD[name])


def _runs(model: Any, causal: bool, full: bool = True) -> dict[str, Any]:
    """Every output the acceptance compares: logits (plain, padded, packed), a cached step, greedy tokens
    (``full=False``: the first two only)."""
    ids = token_ids(1)
    out: dict[str, Any] = {}
    with torch.no_grad():
        out["plain"] = model(ids).logits
        mask = torch.ones_like(ids)
        mask[0, :4] = 0                                               # left padding in row 0
        out["padded"] = model(ids, attention_mask=mask).logits
        if not causal or not full:
            return out
        packed = torch.cat([torch.arange(5), torch.arange(7)])[None]     # two documents in one row
        out["packed"] = model(ids[:1], position_ids=packed).logits
        first = model(ids[:, :8], use_cache=True)
        name = "cache" if "cache" in first else "past_key_values"      # transformers 5.24 renamed it
        out["cached"] = model(ids[:, 8:10], use_cache=True, **{name: first[name]}).logits
        out["greedy"] = model.generate(ids[:, :4], max_new_tokens=32, do_sample=False, min_new_tokens=32)
    return out


def _train_step(model: Any, causal: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad()
    torch.manual_seed(5)                                    # the same dropout masks in both runs
    ids = token_ids(2)
    loss = model(ids, labels=ids).loss if causal else model(ids).logits.square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.eval()
    return loss.detach(), grads


@pytest.mark.slow  # an HF model per family, generation and training
@pytest.mark.parametrize("name", list(BUILD))
def test_patched_model_equals_hf(name: str) -> None:
    model = _model(name)
    causal = name in CAUSAL
    family = recognise(model)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    hf_emb = model.get_input_embeddings()
    want, (want_loss, want_grads) = _runs(model, causal), _train_step(model, causal)
    report = patch(model)
    assert isinstance(report, PatchReport) and report.model_type == name
    assert isinstance(model.get_input_embeddings(), SharedTokenEmbedding)
    assert model.get_input_embeddings().weight is hf_emb.weight
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    if family.rope is not None:
        assert report.rope_function is not None and report.rope_layers >= 1 and report.angles == "hf"
    else:
        assert report.rope_function is None
    got, (got_loss, got_grads) = _runs(model, causal), _train_step(model, causal)
    for key in want:
        if key == "greedy":
            assert torch.equal(got[key], want[key]), key
        else:
            assert_hf_close(got[key], want[key])
    assert_hf_close(got_loss, want_loss)
    assert got_grads.keys() == want_grads.keys()
    for n in want_grads:
        assert_hf_close(got_grads[n], want_grads[n])
    unpatch(model)
    assert model.get_input_embeddings() is hf_emb
    again = _runs(model, causal, full=False)
    for key in again:
        assert torch.equal(again[key], want[key]), key


@pytest.mark.slow  # an HF model per family
@pytest.mark.parametrize("name", ["llama", "gptj", "llama4_text", "qwen2_vl", "gemma3_text", "gemma3"])
def test_exact_angles_match_hf_at_short_positions(name: str) -> None:
    """angles="exact": the model's rotary module is rebuilt; logits stay within fp32 rounding of HF's."""
    model = _model(name)
    ids = token_ids(3)
    with torch.no_grad():
        want = model(ids).logits
        report = patch(model, angles="exact")
        assert report.angles == "exact" and report.rotary_modules
        assert all(isinstance(model.get_submodule(n), ExactAngles) for n in report.rotary_modules)
        got = model(ids).logits
        unpatch(model)
        assert torch.equal(model(ids).logits, want)
    assert_hf_close(got, want)


def test_exact_angles_on_a_model_without_a_rotary_module_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family whose attention makes its own cos / sin (GPT-J before transformers 5.24) has no module for
    angles="exact" to replace: refused, model unchanged (it used to report "exact" and keep HF's angles)."""
    import dataclasses
    import importlib

    patch_module = importlib.import_module("tokenpos.torch.hf.patch")    # the attribute is the function
    model = _model("llama")
    ids = token_ids(3)
    with torch.no_grad():
        want = model(ids).logits
    family = dataclasses.replace(recognise(model), rotary=())
    monkeypatch.setattr(patch_module, "recognise", lambda m: family)
    with pytest.raises(ConfigError, match="has none"):
        patch(model, angles="exact")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_exact_angles_are_closer_to_float64_at_long_positions() -> None:
    """At position ~1e5 HF's float32 angles put cos off by ~1e-3; tokenpos's float64 ones by one fp32 rounding."""
    model = _model("llama")
    pos = torch.arange(100_000, 100_064)[None]
    x = torch.zeros(1, 1, dtype=torch.float32)
    hf_cos, _ = model.model.rotary_emb(x, pos)
    patch(model, angles="exact")
    ex_cos, _ = model.model.rotary_emb(x, pos)
    unpatch(model)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    truth = torch.cos(pos[0, :, None].double() * inv)                           # (L, F)
    err_hf = (hf_cos[0, :, :8].double() - truth).abs().max()
    err_ex = (ex_cos[0, :, :8].double() - truth).abs().max()
    assert err_ex <= 2.0 ** -24 < 1e-4 < err_hf


@pytest.mark.slow  # torch.compile
def test_torch_compile_on_patched_model() -> None:
    """One graph (fullgraph=True) that holds tokenpos's ops; same logits. (The default inductor backend
    also works; it is left out here for CI time: ~30 s on 2 CPU cores.)"""
    model = _model("llama")
    got, want, targets = compiled_patched(model, token_ids(4))
    assert any("tokenpos.rope_qk" in t for t in targets) and any("tokenpos.embedding" in t for t in targets)
    assert_hf_close(got, want)


def test_gemma_scale_is_rounded_to_the_weight_dtype_before_the_multiply() -> None:
    """bf16 weights, float32 embed_scale buffer (as after loading bf16 weights into a float32-built model):
    HF multiplies by the buffer cast to bf16 (sqrt(48) = 6.928... -> 6.9375), so must tokenpos."""
    torch.manual_seed(0)
    model = T.Gemma2ForCausalLM(T.Gemma2Config(**{**KW, "hidden_size": 48}, head_dim=16)).eval()
    emb = model.get_input_embeddings()
    emb.weight.data = emb.weight.data.to(torch.bfloat16)
    assert emb.embed_scale.dtype == torch.float32
    ids = token_ids(5)
    with torch.no_grad():
        want = emb(ids)
        report = patch(model, rope=False)
        got = model.get_input_embeddings()(ids)
    unpatch(model)
    assert report.embedding_scale == float(torch.tensor(48 ** 0.5).to(torch.bfloat16)) != 48 ** 0.5
    assert torch.equal(got, want)


@pytest.mark.parametrize("rope", [False, True])
def test_a_cast_after_patch_reaches_the_scale_and_what_unpatch_puts_back(rope: bool) -> None:
    """``model.to(bfloat16)`` after patch: Gemma's scale was frozen at its float32 value (logits 0.0195 off), and
    the HF rotary module displaced by ``angles="exact"`` stayed float32, so the unpatched model differed from one
    never patched. Both now follow every cast of the model."""
    ids = token_ids(5)
    cases = [("gemma2", {"rope": rope})] + ([("llama", {"angles": "exact"})] if rope else [])
    for name, kw in cases:
        model, ref = _model(name), _model(name)
        patch(model, **kw)
        model.to(torch.bfloat16)
        ref.to(torch.bfloat16)
        with torch.no_grad():
            if not rope:                                                  # the embedding alone: bit for bit
                assert torch.equal(model(ids).logits, ref(ids).logits), name
            unpatch(model)
            assert torch.equal(model(ids).logits, ref(ids).logits), name
        assert [b.dtype for b in model.buffers()] == [b.dtype for b in ref.buffers()], name


def test_an_input_embedding_with_hooks_is_refused_and_nothing_changes() -> None:
    """HF's enable_input_require_grads (PEFT, gradient checkpointing) hooks the input embedding; the replacement
    never ran the hook, so training failed ("element 0 of tensors does not require grad"). Refused by name;
    patching first and hooking after works."""
    model = _model("llama")
    model.enable_input_require_grads()
    before = model.get_input_embeddings()
    with pytest.raises(ConfigError, match="input embedding of this LlamaForCausalLM has hooks"):
        patch(model)
    assert model.get_input_embeddings() is before
    fresh = _model("llama")
    patch(fresh)
    fresh.enable_input_require_grads()
    out = fresh(token_ids(1))
    assert out.logits.requires_grad


def test_unsupported_family_is_refused_and_the_model_unchanged() -> None:
    torch.manual_seed(0)
    model = T.OPTForCausalLM(T.OPTConfig(vocab_size=V, hidden_size=64, num_hidden_layers=1, ffn_dim=64,
                                         num_attention_heads=4, word_embed_proj_dim=64))
    before = model.get_input_embeddings()
    with pytest.raises(ConfigError, match=r"'opt' \(OPTForCausalLM\).*|llama.*opt"):
        patch(model)
    assert model.get_input_embeddings() is before and not hasattr(model, "_tokenpos_patch")
    with pytest.raises(ConfigError, match="not patched"):
        unpatch(model)


def test_refused_calls_change_nothing() -> None:
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    model = _model("llama")
    with pytest.raises(ConfigError, match="angles"):
        patch(model, angles="float64")
    with pytest.raises(ConfigError, match="rope=True"):
        patch(model, rope=False, angles="exact")
    gpt2 = _model("gpt2")
    with pytest.raises(ConfigError, match="rope=True"):
        patch(gpt2, angles="exact")
    assert modeling_llama.apply_rotary_pos_emb is original and type(model.model.embed_tokens) is torch.nn.Embedding
    patch(model)
    with pytest.raises(ConfigError, match="already patched"):
        patch(model)
    unpatch(model)


def test_only_the_patched_model_runs_tokenpos_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    """The modeling module is never changed: a model nobody patched runs HF's RoPE, and unpatching one
    model gives its bit-identical outputs back while another is still patched. In bf16, where the two
    rotations round differently, a process-wide swap would show in both (it did, until stop 45)."""
    import importlib

    from transformers.models.llama import modeling_llama

    hp = importlib.import_module("tokenpos.torch.hf.rope_helpers")   # the replacements call the op
    original = modeling_llama.apply_rotary_pos_emb
    calls: list[int] = []
    real = hp.rotate_qk
    monkeypatch.setattr(hp, "rotate_qk", lambda *a: calls.append(1) or real(*a))
    a, b, c = (_model("llama").to(torch.bfloat16) for _ in range(3))
    ids = token_ids(2)
    with torch.no_grad():
        want_a, want_c = a(ids).logits, c(ids).logits
        patch(a)
        patch(b, embedding=False)
        assert modeling_llama.apply_rotary_pos_emb is original
        assert torch.equal(c(ids).logits, want_c) and not calls           # never patched: HF's own code
        b(ids)
        assert len(calls) == KW["num_hidden_layers"]                      # one rope_qk per attention layer
        assert not torch.equal(a(ids).logits, want_a)                     # bf16: tokenpos rounds once
        unpatch(a)
        calls.clear()
        assert torch.equal(a(ids).logits, want_a) and not calls           # while b is still patched
        unpatch(b)
    assert not any("forward" in vars(m) for m in [*a.modules(), *b.modules()])


def test_an_attention_module_with_a_forward_of_its_own_is_refused_and_nothing_changes() -> None:
    """A forward set on the instance (accelerate's hooks do this) is not the class's code that patch
    copies: refused before any change."""
    import functools

    model = _model("llama")
    attn = model.model.layers[1].self_attn
    own = functools.partial(type(attn).forward, attn)
    attn.forward = own
    emb = model.get_input_embeddings()
    with pytest.raises(ConfigError, match=r"model\.layers\.1\.self_attn .*forward of its own"):
        patch(model)
    assert attn.forward is own and model.get_input_embeddings() is emb
    assert not any("forward" in vars(m) for m in model.modules() if m is not attn)
    patch(model, rope=False)                                              # the embedding alone still patches
    unpatch(model)


def test_the_blhd_layout_of_the_rope_function_and_a_bad_one() -> None:
    """unsqueeze_dim=2 (q, k as (B, L, H, Dh)) gives HF's result; another value is refused, not misread."""
    from transformers.models.llama import modeling_llama

    from tokenpos.torch.hf.patch import rope_qk_half

    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 5, 4, 16, generator=g), torch.randn(2, 5, 2, 16, generator=g)
    ang = torch.rand(2, 5, 8, generator=g) * 5
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    got = rope_qk_half(q, k, cos, sin, unsqueeze_dim=2)
    for a, b in zip(got, want, strict=True):
        assert_hf_close(a, b)
    with pytest.raises(ConfigError, match="unsqueeze_dim"):
        rope_qk_half(q, k, cos, sin, unsqueeze_dim=0)


def test_the_public_names_of_patch_stay_importable_from_it() -> None:
    """patch.py was split by concept (the RoPE replacements, exact angles, the forward copies, the embedding /
    head / resize wiring): every public name it held is still importable from it, as the same object."""
    import importlib

    from tokenpos.torch.hf import exact, rope_helpers

    hp = importlib.import_module("tokenpos.torch.hf.patch")
    for name in ("REPLACEMENTS", "TABLE_FORMS", "rope_qk_half", "rope_glm", "rope_cohere", "rope_x",
                 "rope_deinterleave", "rope_gptj", "rope_llama4"):
        assert getattr(hp, name) is getattr(rope_helpers, name), name
    for name in ("ExactAngles", "EXACT_ATOL", "ROTARY_UNREAD"):
        assert getattr(hp, name) is getattr(exact, name), name
    assert hp.ANGLES == ("hf", "exact") and (hp.patch, hp.unpatch, hp.PatchReport) == (patch, unpatch, PatchReport)
    assert set(rope_helpers.REPLACEMENTS.values()) == {getattr(hp, n) for n in hp.__all__ if n.startswith("rope_")}
