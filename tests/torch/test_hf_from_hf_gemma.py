"""from_hf, per_layer_from_hf and rotary_from_hf for Gemma 3n and Gemma 4 text models (tiny random configs, never
downloaded), against the HF models themselves: the token block equals ``embed_tokens`` (float32 and bf16), the
per-layer table equals ``get_per_layer_inputs`` (torch.equal), the whole chain (tokenpos's two tables through HF's
``project_per_layer_inputs``) equals the per-layer inputs every decoder layer of HF's forward receives, HF's
forward given the tokenpos tables' outputs gives its own logits and greedy tokens, and the RoPE of each layer type
rotates q as the model's own rotary module does (Gemma 4's full-attention layers with their own head_dim)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL
from tests.torch.hf_models import eval_model, seeded
from tests.torch.test_hf_gemma3n import BUILD, COMMON, LAYERS, VP, P, V, _ids
from tokenpos.torch.hf import from_hf, per_layer_from_hf, rotary_from_hf

transformers = pytest.importorskip("transformers")
T = transformers
# Gemma 4 with full-attention layers of another head_dim (32) than the sliding ones (16), as the released models
BUILD = {**BUILD, "gemma4_text_global_head_dim": lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(
    **{**COMMON, "vocab_size_per_layer_input": V}, global_head_dim=32,
    layer_types=["sliding_attention", "full_attention"] * 2))}
NAMES = list(BUILD)


def _model(name: str) -> Any:
    return eval_model(BUILD[name])


def _kind(name: str) -> str:
    return "gemma3n_text" if name.startswith("gemma3n") else "gemma4_text"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES[:2])
def test_token_block_and_per_layer_table_equal_hfs(name: str, dtype: torch.dtype) -> None:
    model = _model(name).to(dtype)
    ids = _ids(name)
    emb, per = from_hf(model), per_layer_from_hf(model)
    assert isinstance(per, tpt.PerLayerEmbedding) and (per.num_layers, per.dim, per.padding_idx) == (LAYERS, P, 0)
    assert per.out_of_range == ("zero" if name == "gemma3n_text" else "raise")
    assert per.weight.dtype == emb.token.weight.dtype == dtype
    assert emb.positional == "none"                          # RoPE per layer type: rotary_from_hf
    with torch.no_grad():
        assert torch.equal(emb(ids), model.model.embed_tokens(ids))
        assert torch.equal(per(ids), model.model.get_per_layer_inputs(ids))          # ids past Gemma 3n's table too
    assert per.weight is not model.model.embed_tokens_per_layer.weight                # a copy, as from_hf's tables


def _per_layer_inputs_hf_receives(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """The per-layer input (B, L, P) each decoder layer of HF's forward is called with, in layer order."""
    seen: list[torch.Tensor] = []

    def hook(m: Any, args: Any, kwargs: Any) -> None:              # by name: the families order them differently
        seen.append(inspect.signature(m.forward).bind(*args, **kwargs).arguments["per_layer_input"].detach())

    hooks = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    with torch.no_grad():
        logits = model(ids).logits
    for h in hooks:
        h.remove()
    seen.append(logits)
    return seen


@pytest.mark.parametrize("name", NAMES[:2])
def test_the_whole_chain_equals_the_per_layer_inputs_of_hfs_forward(name: str) -> None:
    """tokenpos's token block and per-layer table through HF's ``project_per_layer_inputs``: the per-layer input
    each decoder layer receives in HF's own forward; HF's forward given ``inputs_embeds`` and ``per_layer_inputs``
    from the tokenpos tables: its own logits."""
    model = _model(name)
    ids = _ids(name, seed=2)
    emb, per = from_hf(model), per_layer_from_hf(model)
    *want, logits = _per_layer_inputs_hf_receives(model, ids)
    with torch.no_grad():
        x = emb(ids)
        chain = model.model.project_per_layer_inputs(x, per(ids))                   # (B, L, LAYERS, P)
        assert chain.shape == (*ids.shape, LAYERS, P) and len(want) == LAYERS
        for i in range(LAYERS):
            assert torch.equal(chain[:, :, i], want[i])
        got = model(inputs_embeds=x, per_layer_inputs=per(ids)).logits
    assert torch.equal(got, logits)


@pytest.mark.parametrize("name", NAMES[:2])
def test_greedy_tokens_from_the_tokenpos_tables_equal_hfs_generate(name: str) -> None:
    model = _model(name)
    emb, per = from_hf(model), per_layer_from_hf(model)
    ids = _ids(name, seed=3, padding=False)[:1, :4]
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        got = ids
        for _ in range(6):                                   # no cache: the whole prefix through the tables each step
            logits = model(inputs_embeds=emb(got), per_layer_inputs=per(got)).logits
            got = torch.cat([got, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", NAMES)
def test_rotary_per_layer_type_rotates_as_the_models_rotary_module(name: str) -> None:
    model = _model(name)
    rotary = rotary_from_hf(model)
    assert sorted(rotary) == ["full_attention", "sliding_attention"]
    mod = __import__(f"transformers.models.{_kind(name)[:-5]}.modeling_{_kind(name)[:-5]}", fromlist=["x"])
    pos = torch.arange(40, 49)[None].expand(2, 9)
    tol = TOL["hf.rope_rotated"]
    for i, kind in enumerate(model.config.layer_types):
        dh = model.model.layers[i].self_attn.head_dim
        assert rotary[kind].head_dim == dh
        q = torch.randn(2, 4, 9, dh, generator=torch.Generator().manual_seed(i))
        cos, sin = model.model.rotary_emb(q, pos, kind)
        want = mod.apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=1)
        got = rotary[kind].apply(q, positions=pos)
        got = got[0] if isinstance(got, tuple) else got
        bound = (tol["atol"] + tol["per_position"] * 48) * float(q.abs().max())
        assert float((got - want).abs().max()) <= bound, (kind, dh)
    if name == "gemma4_text_global_head_dim":
        assert (rotary["full_attention"].head_dim, rotary["sliding_attention"].head_dim) == (32, 16)


def test_training_mode_freeze_and_gradients_follow_hfs() -> None:
    model = _model("gemma4_text")
    model.train()
    per = per_layer_from_hf(model)
    assert per.training and per.weight.requires_grad
    assert not per_layer_from_hf(model, freeze=True).weight.requires_grad
    ids = _ids("gemma4_text")
    g = torch.randn(*ids.shape, LAYERS, P, generator=torch.Generator().manual_seed(4))
    (per(ids) * g).sum().backward()
    (model.model.get_per_layer_inputs(ids) * g).sum().backward()
    hf_grad = model.model.embed_tokens_per_layer.weight.grad
    torch.testing.assert_close(per.weight.grad, hf_grad, **TOL["grad.float32"])
    assert not per.weight.grad[0].any()                                             # the padding row: none


def test_other_models_and_a_model_without_a_per_layer_table_are_refused() -> None:
    plain = seeded(lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(
        **{**COMMON, "hidden_size_per_layer_input": 0}, layer_types=["sliding_attention", "full_attention"] * 2)))
    with pytest.raises(tpt.ConfigError, match="has no per-layer table"):
        per_layer_from_hf(plain)
    assert torch.equal(from_hf(plain)(torch.tensor([[1, 2]])), plain.model.embed_tokens(torch.tensor([[1, 2]])))
    llama = seeded(lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=32,
                                                            num_hidden_layers=1, num_attention_heads=2)))
    for fn in (per_layer_from_hf, rotary_from_hf):
        with pytest.raises(tpt.ConfigError, match=r"Gemma 3n / Gemma 4 text models .*model_type 'llama'"):
            fn(llama)
    assert VP < V                                                     # Gemma 3n's table is smaller than the vocab
    model = _model("gemma4_text")
    with pytest.raises(tpt.TokenIdError, match=rf"token id {V} at index \(0, 1\)"):
        per_layer_from_hf(model)(torch.tensor([[3, V]]))
