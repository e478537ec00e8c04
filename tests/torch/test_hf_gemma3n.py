"""PerLayerEmbedding against HF Gemma 3n and Gemma 4 text models themselves (tiny random configs, never downloaded).

(a) tokenpos's per-layer inputs equal HF's ``get_per_layer_inputs`` in both backends, given HF's
``embed_tokens_per_layer.weight`` loaded as it is; (b) ``patch(model)`` replaces the per-layer table by a
``SharedPerLayerEmbedding`` over the same Parameter: logits, a training step's gradients and 8 greedy tokens
equal the unpatched model's, and ``unpatch`` restores HF's module (bit-identical outputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tests.torch.hf_models import eval_model, seeded
from tokenpos.torch.hf import patch, unpatch
from tokenpos.torch.hf.per_layer import SharedPerLayerEmbedding

transformers = pytest.importorskip("transformers")
T = transformers
V, VP, LAYERS, P = 128, 96, 4, 12             # vocab, Gemma 3n's per-layer vocab (ids 96..127: "multimodal"), L, P
KEY = "model.embed_tokens_per_layer.weight"
COMMON = {"vocab_size": V, "vocab_size_per_layer_input": VP, "hidden_size": 64, "hidden_size_per_layer_input": P,
          "intermediate_size": 64, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "sliding_window": 8, "max_position_embeddings": 256}
BUILD: dict[str, Any] = {
    "gemma3n_text": lambda: T.Gemma3nForCausalLM(T.Gemma3nTextConfig(
        **COMMON, num_kv_shared_layers=2, laurel_rank=8, altup_num_inputs=2,
        layer_types=["sliding_attention", "full_attention"] * 2)),
    # Gemma 4's text model maps no id: its per-layer table covers the vocabulary (as the released models' does)
    "gemma4_text": lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(
        **{**COMMON, "vocab_size_per_layer_input": V}, global_head_dim=16,
        layer_types=["sliding_attention", "full_attention"] * 2)),
}


def _model(name: str) -> Any:
    return eval_model(BUILD[name])


def _ids(name: str, seed: int = 1, padding: bool = True) -> torch.Tensor:
    """Ids with the padding id (``padding``) and duplicates; for Gemma 3n also ids >= VP (its multimodal ids,
    mapped to row 0 by HF)."""
    ids = torch.randint(1, V, (2, 10), generator=torch.Generator().manual_seed(seed))
    if padding:
        ids[0, :2] = 0
    ids[1, 3] = ids[1, 4]
    if name == "gemma3n_text":
        ids[1, 5:7] = torch.tensor([VP, V - 1])
    return ids


def _layers(cfg: Any, backend: Any, name: str, **kw: Any) -> Any:
    return backend.PerLayerEmbedding(cfg.vocab_size_per_layer_input, cfg.num_hidden_layers,
                                     cfg.hidden_size_per_layer_input, padding_idx=cfg.pad_token_id,
                                     out_of_range="zero" if name == "gemma3n_text" else "raise", seed=0, **kw)


@pytest.mark.parametrize("name", list(BUILD))
def test_per_layer_inputs_equal_hfs_in_both_backends(name: str) -> None:
    model = _model(name)
    ids = _ids(name)
    with torch.no_grad():
        want = model.model.get_per_layer_inputs(ids)                             # (B, L, layers, P)
    assert want.shape == (*ids.shape, LAYERS, P)
    state = {"weight": model.state_dict()[KEY]}                                  # HF's key, loaded as it is
    layer = _layers(model.config, tpt, name)
    layer.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(layer(ids), want)                                     # float32: bit for bit
    np_layer = _layers(model.config, tpn, name)
    np_layer.load_state_dict({"weight": state["weight"].numpy()})
    np.testing.assert_array_equal(np_layer(ids.numpy()), want.numpy())
    model.to(torch.bfloat16)                                                     # HF's bf16 scale: 3.46875
    layer.to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(ids), model.model.get_per_layer_inputs(ids))
    assert layer.multiplier == 3.46875 != np_layer.multiplier


def test_gemma4s_lookup_and_ours_refuse_an_id_past_the_table() -> None:
    model = _model("gemma4_text")
    layer = _layers(model.config, tpt, "gemma4_text")
    bad = torch.tensor([[3, V]])
    with pytest.raises(IndexError):
        model.model.get_per_layer_inputs(bad)
    with pytest.raises(tpt.TokenIdError, match=rf"token id {V} at index \(0, 1\) is out of range \[0, {V}\)"):
        layer(bad)                                                               # an IndexError too, typed


def _outputs(model: Any, name: str) -> dict[str, torch.Tensor]:
    ids = _ids(name, seed=2)
    with torch.no_grad():
        out = {"logits": model(ids).logits,
               "greedy": model.generate(ids[:1, :4], max_new_tokens=8, min_new_tokens=8, do_sample=False)}
    model.train()
    model.zero_grad()
    # no padding id here: HF Gemma 3n's own backward is NaN through its zero row (AltUp's sqrt of a zero mean)
    train_ids = _ids(name, seed=2, padding=False)
    model(train_ids, labels=train_ids).loss.backward()
    out["grad"] = model.get_submodule("model.embed_tokens_per_layer").weight.grad.clone()
    model.zero_grad()
    model.eval()
    return out


@pytest.mark.slow                                   # 2-7 s each on 2 busy cores: generation and a training step
@pytest.mark.parametrize("rope", [True, False], ids=["rope_and_tables", "tables_only"])
@pytest.mark.parametrize("name", list(BUILD))
def test_patched_model_equals_unpatched(name: str, rope: bool) -> None:
    model = _model(name)
    hf_table = model.model.embed_tokens_per_layer
    keys = list(model.state_dict())
    want = _outputs(model, name)
    report = patch(model, rope=rope)
    assert list(model.state_dict()) == keys                      # the checkpoint's keys, unchanged
    assert report.per_layer == "model.embed_tokens_per_layer"
    table = model.model.embed_tokens_per_layer
    assert isinstance(table, SharedPerLayerEmbedding) and table.weight is hf_table.weight
    assert (table.num_layers, table.dim, table.padding_idx) == (LAYERS, P, 0)
    assert "model.embed_tokens_per_layer.weight" in dict(model.named_parameters())
    got = _outputs(model, name)
    assert torch.equal(got["greedy"], want["greedy"])
    if rope:                                                    # tokenpos's RoPE rounds differently from HF's
        for key in ("logits", "grad"):
            torch.testing.assert_close(got[key], want[key], **TOL["hf.patch"])
    else:                                                       # the tables alone: the same arithmetic
        assert torch.equal(got["logits"], want["logits"])
        torch.testing.assert_close(got["grad"], want["grad"], **TOL["hf.patch"])   # summation order differs
    unpatch(model)
    assert model.model.embed_tokens_per_layer is hf_table
    with torch.no_grad():
        assert torch.equal(model(_ids(name, seed=2)).logits, want["logits"])


def test_a_cast_after_patch_reaches_the_scale_and_the_displaced_table() -> None:
    model = _model("gemma3n_text")
    ids = _ids("gemma3n_text")
    patch(model, rope=False)
    model.to(torch.bfloat16)
    table = model.model.embed_tokens_per_layer
    assert table.multiplier == 3.46875 and table.weight.dtype == torch.bfloat16
    with torch.no_grad():
        got = model.model.get_per_layer_inputs(ids)
        unpatch(model)
        assert model.model.embed_tokens_per_layer.weight.dtype == torch.bfloat16
        assert torch.equal(got, model.model.get_per_layer_inputs(ids))


def test_embedding_false_leaves_the_per_layer_table_and_a_model_without_one_reports_none() -> None:
    model = _model("gemma4_text")
    hf_table = model.model.embed_tokens_per_layer
    report = patch(model, embedding=False)
    assert report.per_layer is None and model.model.embed_tokens_per_layer is hf_table
    unpatch(model)
    plain = seeded(lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(
        **{**COMMON, "hidden_size_per_layer_input": 0}, layer_types=["sliding_attention", "full_attention"] * 2)))
    assert patch(plain).per_layer is None
    unpatch(plain)


def test_a_hooked_per_layer_table_is_refused_before_any_change() -> None:
    model = _model("gemma3n_text")
    hf_table = model.model.embed_tokens_per_layer
    hf_table.register_forward_hook(lambda *a: None)
    with pytest.raises(tpt.ConfigError, match="embed_tokens_per_layer has hooks"):
        patch(model)
    assert model.model.embed_tokens_per_layer is hf_table
    assert not isinstance(model.get_input_embeddings(), tpt.TokenEmbedding)
    patch(model, embedding=False)                                  # the model was left unpatched
    unpatch(model)


def test_resize_token_embeddings_of_a_patched_model_resizes_the_per_layer_table_as_hf_does() -> None:
    """Gemma 3n's ``resize_token_embeddings`` resizes the per-layer table too (HF's ``_resize_per_layer_embeddings``):
    on a patched model it runs on HF's table and a new tokenpos table takes its place; the same rows as HF's own
    resize draws from the same generator state, the same logits, and unpatch puts back the resized HF table."""
    model, ref = _model("gemma3n_text"), _model("gemma3n_text")
    patch(model, rope=False)
    for m in (model, ref):
        seeded(lambda m=m: m.resize_token_embeddings(V + 8), seed=7)
    table = model.model.embed_tokens_per_layer
    assert isinstance(table, SharedPerLayerEmbedding) and table.vocab_size == V + 8
    assert model.config.vocab_size_per_layer_input == ref.config.vocab_size_per_layer_input == V + 8
    assert torch.equal(table.weight, ref.model.embed_tokens_per_layer.weight)
    ids = torch.tensor([[5, V + 3, V - 1, 9]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
        unpatch(model)
        assert type(model.model.embed_tokens_per_layer) is type(ref.model.embed_tokens_per_layer)
        assert model.model.embed_tokens_per_layer.weight.shape == (V + 8, LAYERS * P)
        assert "_resize_per_layer_embeddings" not in vars(model)
        assert torch.equal(model(ids).logits, ref(ids).logits)
