"""``model.resize_token_embeddings(n)`` on a patched Hugging Face model equals it on the unpatched model
(issue 48 item 10): the same new rows (HF's draws, same seed), the tied head still tied, the same logits,
and the tokenpos embedding still in place; unpatch afterwards gives HF's resized model."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.tolerances import TOL
from tests.torch.hf_models import decoder_kwargs, seeded
from tokenpos.torch.hf import patch, unpatch
from tokenpos.torch.hf.embedding import SharedTokenEmbedding

transformers = pytest.importorskip("transformers")
T = transformers
V = 64
KW = decoder_kwargs(V, 32, 48, 1, 64)
BUILD: dict[str, Any] = {
    "tied": lambda: T.LlamaForCausalLM(T.LlamaConfig(**KW, tie_word_embeddings=True)),
    "untied": lambda: T.LlamaForCausalLM(T.LlamaConfig(**KW, tie_word_embeddings=False)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**KW, head_dim=8, sliding_window=4, pad_token_id=0)),
}
# (new_num_tokens, pad_to_multiple_of, mean_resizing)
RESIZES = [(V + 7, None, True), (V + 7, None, False), (V + 3, 16, True), (V - 5, None, True)]


def _pair(name: str) -> tuple[Any, Any]:
    ref = seeded(BUILD[name]).eval()
    return ref, copy.deepcopy(ref)


def _resize(model: Any, args: tuple[Any, ...]) -> Any:
    return seeded(lambda: model.resize_token_embeddings(*args), seed=5)  # HF draws new rows from torch.manual_seed


@pytest.mark.parametrize("name", list(BUILD))
@pytest.mark.parametrize("args", RESIZES)
def test_resize_of_a_patched_model_equals_hf(name: str, args: tuple[Any, ...]) -> None:
    ref, ours = _pair(name)
    patch(ours)
    weight = ours.get_input_embeddings().weight
    _resize(ref, args)
    out = _resize(ours, args)
    n = ref.get_input_embeddings().weight.shape[0]
    assert n != V
    emb = ours.get_input_embeddings()
    assert out is emb and isinstance(emb, SharedTokenEmbedding) and emb.vocab_size == n
    assert emb.weight is weight                             # the same Parameter (an optimiser's reference holds)
    assert ours.config.vocab_size == ref.config.vocab_size == n
    assert torch.equal(emb.weight, ref.get_input_embeddings().weight)
    assert torch.equal(ours.lm_head.weight, ref.lm_head.weight)
    assert (ours.lm_head.weight is emb.weight) == (ref.lm_head.weight is ref.get_input_embeddings().weight)
    assert (ours.lm_head.weight is emb.weight) == (name != "untied")
    ids = torch.arange(n).reshape(1, n) % n
    torch.testing.assert_close(ours(input_ids=ids).logits, ref(input_ids=ids).logits, **TOL["hf.patch"])
    unpatch(ours)
    assert torch.equal(ours(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_resize_then_train_with_the_loss_patch() -> None:
    """An untied head replaced by HF's resize gets the tied loss at the next forward: equal loss and gradients."""
    ref, ours = _pair("untied")
    patch(ours, loss=True)
    _resize(ref, (V + 9,))
    _resize(ours, (V + 9,))
    ids = torch.randint(0, V + 9, (2, 10), generator=torch.Generator().manual_seed(1))
    for m in (ref, ours):
        m.train()
        m(input_ids=ids, labels=ids).loss.backward()
    assert "forward" in vars(ours.lm_head)                  # the new head records its input: no logits made
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, n
        assert (a.grad - b.grad).abs().max() <= 1e-5 * b.grad.abs().max()


def test_a_refused_resize_leaves_the_tokenpos_embedding() -> None:
    ref, ours = _pair("tied")
    patch(ours)
    emb = ours.get_input_embeddings()
    with pytest.raises(ValueError):                          # HF's own refusal
        ours.resize_token_embeddings(V + 1, pad_to_multiple_of=2.5)
    new = ours.get_input_embeddings()
    assert isinstance(new, SharedTokenEmbedding) and new.weight is emb.weight and new.vocab_size == V
    ids = torch.arange(V)[None]
    torch.testing.assert_close(ours(input_ids=ids).logits, ref(input_ids=ids).logits, **TOL["hf.patch"])
