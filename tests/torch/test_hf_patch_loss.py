"""patch(model, loss=True) against the same Hugging Face model unpatched: the loss and every parameter's gradient
(tiny random configs built here), HF's semantics (shift, ignore_index, num_items_in_batch, shift_labels,
logits_to_keep, soft-cap, bias, scale), bf16, all labels ignored, the outputs, unpatch and the refusals.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch
from torch import nn

from tests.tolerances import TOL
from tests.torch.hf_models import decoder_kwargs, seeded
from tokenpos.tables import ConfigError
from tokenpos.torch.hf import patch, unpatch

transformers = pytest.importorskip("transformers")
T = transformers
V = 96
KW = decoder_kwargs(V, 32, 48, 2, 64)

BUILD: dict[str, Any] = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**KW, tie_word_embeddings=True)),
    "untied": lambda: T.LlamaForCausalLM(T.LlamaConfig(**KW, tie_word_embeddings=False)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**KW, head_dim=8)),
    # a cap small enough to bend these logits (Gemma 2's 30 would leave tiny random logits as they are)
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**KW, head_dim=8, sliding_window=4,
                                                         final_logit_softcapping=0.05)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                                   n_positions=64, bos_token_id=0, eos_token_id=0)),
    "granite": lambda: T.GraniteForCausalLM(T.GraniteConfig(**KW, embedding_multiplier=3.0, logits_scaling=0.25)),
    "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(**KW, logit_scale=0.5)),
    # the router's auxiliary loss, which HF adds to the loss after loss_function
    "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**KW, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=16, output_router_logits=True)),
}


def _model(name: str) -> Any:
    return seeded(BUILD[name]).train()


def _batch(seed: int = 1, B: int = 2, L: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, L), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100                                       # a prompt not trained on
    labels[-1, -3:] = -100                                     # padding
    return ids, labels


def _run(model: Any, **kw: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """max|a - b| <= scale * max|b| (relative to the gradient's size), in float64."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    assert (a - b).abs().max().item() <= scale * max(b.abs().max().item(), 1e-30)


def _compare(name: str, scale: float = 1e-5, dtype: torch.dtype = torch.float32, **kw: Any) -> Any:
    ref = _model(name).to(dtype)
    ours = copy.deepcopy(ref)
    report = patch(ours, loss=True)
    assert report.loss == "lm_head"
    r, rg = _run(ref, **kw)
    o, og = _run(ours, **kw)
    assert o.logits is None and r.logits is not None
    assert o.loss.dtype == torch.float32 and r.loss.dtype == torch.float32
    torch.testing.assert_close(o.loss, r.loss, rtol=TOL["hf.patch"]["rtol"] if dtype == torch.float32 else scale,
                               atol=0.0)
    assert rg.keys() == og.keys() and len(rg) == len(list(ref.parameters()))
    for n in rg:
        assert og[n].dtype == rg[n].dtype
        _close(og[n], rg[n], scale)
    return ours


@pytest.mark.parametrize("name", list(BUILD))
def test_loss_and_every_gradient_equal_hf(name: str) -> None:
    ids, labels = _batch()
    _compare(name, input_ids=ids, labels=labels)


@pytest.mark.parametrize("name", ["llama", "untied", "gemma2"])
@pytest.mark.parametrize("n", [torch.tensor(13), 13])
def test_num_items_in_batch_divides_the_sum(name: str, n: Any) -> None:
    """Gradient accumulation: HF's Trainer passes the count of the whole accumulated batch."""
    ids, labels = _batch()
    _compare(name, input_ids=ids, labels=labels, num_items_in_batch=n)


def test_shift_labels_are_used_as_they_are() -> None:
    ids, labels = _batch()
    shift = torch.roll(labels, -2, dims=1)                     # not the shift HF would make
    _compare("qwen3", input_ids=ids, labels=labels, shift_labels=shift)


def test_logits_to_keep_with_labels_of_the_kept_positions() -> None:
    ids, labels = _batch()
    _compare("llama", input_ids=ids, labels=labels[:, -5:], logits_to_keep=5)


def test_packed_row_positions() -> None:
    """DataCollatorWithFlattening's batch: one row, positions restarting, -100 at each document's start."""
    ids, _ = _batch(B=1, L=14)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5]])
    labels = torch.where(pos == 0, -100, ids)
    _compare("gemma2", input_ids=ids, labels=labels, position_ids=pos)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_every_label_ignored_gives_zero_loss_and_zero_gradients(name: str) -> None:
    ids, labels = _batch()
    labels = torch.full_like(labels, -100)
    ours = _model(name)
    patch(ours, loss=True)
    out, grads = _run(ours, input_ids=ids, labels=labels)
    assert out.loss.item() == 0.0                              # HF's "mean" gives NaN here
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads.values())
    ref = _model(name)                                         # with num_items_in_batch HF gives 0 too
    r, rg = _run(ref, input_ids=ids, labels=labels, num_items_in_batch=4)
    o, og = _run(ours, input_ids=ids, labels=labels, num_items_in_batch=4)
    assert o.loss.item() == r.loss.item() == 0.0
    assert all(torch.equal(og[n], rg[n]) for n in rg)


@pytest.mark.parametrize(("name", "dtype"), [("llama", torch.bfloat16), ("gemma2", torch.bfloat16),
                                             ("llama", torch.float16)])
def test_half_model_float32_loss(name: str, dtype: torch.dtype) -> None:
    """bf16 / fp16: HF rounds its logits to the model's dtype before the float32 loss, the tied loss computes them
    in float32: equal to that rounding; gradients in the model's dtype."""
    ids, labels = _batch()
    _compare(name, scale=TOL["hf.patch_loss.half"]["scale"], dtype=dtype, input_ids=ids, labels=labels)


def test_eval_mode_and_no_labels_are_hf_forward() -> None:
    ids, labels = _batch()
    ref = _model("gemma2")
    ours = copy.deepcopy(ref)
    patch(ours, loss=True)
    torch.testing.assert_close(ours(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=0.0, atol=0.0)
    ref.eval()
    ours.eval()
    o, r = ours(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert torch.equal(o.logits, r.logits) and torch.equal(o.loss, r.loss)     # evaluation metrics need logits


def test_tuple_output_positional_labels_and_trainer_signature() -> None:
    ids, labels = _batch()
    ref = _model("llama")
    ours = copy.deepcopy(ref)
    patch(ours, loss=True)
    o = ours(ids, None, None, None, None, labels, return_dict=False)
    r = ref(ids, None, None, None, None, labels, return_dict=False)
    assert isinstance(o, tuple) and o[1] is None
    torch.testing.assert_close(o[0], r[0], **TOL["hf.patch"])
    params = inspect.signature(ours.forward).parameters.values()   # Trainer passes num_items_in_batch if **kwargs
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def test_unpatch_restores_forward_loss_and_head() -> None:
    ids, labels = _batch()
    model = _model("gemma2")
    before = model(input_ids=ids, labels=labels)
    head_forward = model.lm_head.forward
    patch(model, loss=True)
    assert "forward" in vars(model) and "forward" in vars(model.lm_head)
    unpatch(model)
    assert "forward" not in vars(model) and "_loss_function" not in vars(model) and "forward" not in vars(model.lm_head)
    assert model.lm_head.forward == head_forward
    after = model(input_ids=ids, labels=labels)
    assert torch.equal(after.logits, before.logits) and torch.equal(after.loss, before.loss)


def _state(model: nn.Module) -> tuple[Any, ...]:
    return (type(model.get_input_embeddings()), dict(vars(model)).keys(), vars(model.get_output_embeddings()).keys())


class _DoubledForCausalLM(T.LlamaForCausalLM):  # type: ignore[misc,name-defined]
    """A CausalLM whose forward does something to its logits the tied loss does not reproduce."""

    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        hidden_states = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        logits = self.lm_head(hidden_states)
        logits = logits * 2.0
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
        return T.modeling_outputs.CausalLMOutputWithPast(loss=loss, logits=logits)


def _refused(model: Any, match: str) -> None:
    before = _state(model)
    with pytest.raises(ConfigError, match=match):
        patch(model, loss=True)
    assert _state(model) == before
    assert getattr(model, "_tokenpos_patch", None) is None


def test_refuses_what_it_cannot_reproduce_and_leaves_the_model() -> None:
    torch.manual_seed(0)
    _refused(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=4, n_positions=64)),
             "not a \\*ForCausalLM")
    _refused(_DoubledForCausalLM(T.LlamaConfig(**KW)), "runs `logits = logits \\* 2.0` between its head and its loss")
    custom = _model("llama")
    custom.loss_function = lambda *a, **k: torch.zeros(())
    _refused(custom, "loss_function")
    hooked = _model("llama")
    hooked.lm_head.register_forward_hook(lambda *a: None)
    _refused(hooked, "hooks")


def test_a_head_replaced_since_patch_gets_the_loss_again_or_hf_loss() -> None:
    """A new plain nn.Linear head (HF's resize of an untied head) is given the loss mode at the next forward; a
    head of another kind computes HF's logits and loss."""
    ids, labels = _batch()
    ref = _model("untied")
    ours = copy.deepcopy(ref)
    patch(ours, loss=True)
    for m in (ref, ours):
        torch.manual_seed(3)
        m.lm_head = nn.Linear(32, V, bias=False)
    o, og = _run(ours, input_ids=ids, labels=labels)
    r, rg = _run(ref, input_ids=ids, labels=labels)
    assert o.logits is None and "forward" in vars(ours.lm_head)
    torch.testing.assert_close(o.loss, r.loss, **TOL["hf.patch"])

    class Wrapped(nn.Linear):
        pass

    for m in (ref, ours):
        torch.manual_seed(4)
        m.lm_head = Wrapped(32, V, bias=False)
    o, og = _run(ours, input_ids=ids, labels=labels)
    r, rg = _run(ref, input_ids=ids, labels=labels)
    torch.testing.assert_close(o.loss, r.loss, rtol=0.0, atol=0.0)
    unpatch(ours)
    assert "forward" not in vars(ours) and "_loss_function" not in vars(ours)
