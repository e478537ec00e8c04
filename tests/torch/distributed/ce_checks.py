"""The cross-entropy checks each rank runs (see rank_checks.py): against F.cross_entropy on one process.

Shapes: V vocab, D d_model, Vl local columns.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.tolerances import TOL
from tests.torch.distributed.rank_checks import SEED, D, _pair, _raises, count_all_reduce
from tokenpos.tables.errors import TokenIdError
from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy
from tokenpos.torch.distributed._comm import copy_to_group


def _tied_loss(V: int, pad: int, targets: torch.Tensor, **ce: Any) -> None:
    emb, ref = _pair(V, pad_to_multiple_of=pad)
    h0 = torch.randn(*targets.shape, D, generator=torch.Generator().manual_seed(2))
    h, h_ref = h0.clone().requires_grad_(), h0.clone().requires_grad_()
    with count_all_reduce() as calls:
        logits = emb.attend(h)
        logits.retain_grad()
        loss = vocab_parallel_cross_entropy(logits, targets, vocab_size=V, **ce)
    fwd = calls[0]
    ref_logits = ref.attend(h_ref)
    ref_logits.retain_grad()
    ref_loss = F.cross_entropy(ref_logits.reshape(-1, V), targets.reshape(-1), **ce)
    reduction = ce.get("reduction", "mean")
    ref_loss = ref_loss.reshape(targets.shape) if reduction == "none" else ref_loss
    torch.testing.assert_close(loss, ref_loss, **TOL["dist.loss"])
    weights = torch.randn(loss.shape, generator=torch.Generator().manual_seed(3))
    with count_all_reduce() as calls:
        (loss * weights).sum().backward()
    assert (fwd, calls[0]) == ((3, 1) if dist.get_world_size() > 1 else (0, 0)), (fwd, calls[0])
    (ref_loss * weights).sum().backward()
    n = emb.num_real_rows
    s = slice(emb.vocab_start, emb.vocab_start + n)
    torch.testing.assert_close(logits.grad[..., :n], ref_logits.grad[..., s], **TOL["dist.grad"])
    assert not logits.grad[..., n:].any(), "padding columns get no gradient"
    torch.testing.assert_close(h.grad, h_ref.grad, **TOL["dist.grad"])
    torch.testing.assert_close(emb.weight.grad[:n], ref.weight.grad[s], **TOL["dist.grad"])
    assert not emb.weight.grad[n:].any()


def _targets(V: int, shape: tuple[int, ...], ignored: int = 0) -> torch.Tensor:
    t = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(4))
    t.view(-1)[:2] = torch.tensor([0, V - 1])
    t.view(-1)[2: 2 + ignored] = -100
    return t


def check_all_ignored(V: int) -> None:
    emb = VocabParallelEmbedding(V, D, seed=SEED)
    h = torch.randn(2, 3, D, requires_grad=True)
    logits = emb.attend(h)
    logits.retain_grad()
    for reduction in ("mean", "sum"):
        loss = vocab_parallel_cross_entropy(logits, torch.full((2, 3), -100), vocab_size=V, reduction=reduction)
        assert loss.item() == 0.0
        loss.backward(retain_graph=True)
        assert torch.equal(logits.grad, torch.zeros_like(logits)) and torch.equal(h.grad, torch.zeros_like(h))
    assert torch.isnan(F.cross_entropy(torch.zeros(6, V), torch.full((6,), -100)))   # what torch does instead


def check_gradcheck(V: int) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    per = -(-V // world)

    def loss(full: torch.Tensor, targets: torch.Tensor, **ce: Any) -> torch.Tensor:
        padded = F.pad(copy_to_group(full, None, world), (0, per * world - V), value=float("-inf"))
        local = padded[..., rank * per: (rank + 1) * per]
        return vocab_parallel_cross_entropy(local, targets, vocab_size=V, **ce)

    x = torch.randn(3, 2, V, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    t = torch.tensor([[0, V - 1], [-100, 2], [1, 3]])
    for ce in ({}, {"label_smoothing": 0.2}, {"reduction": "sum"}, {"reduction": "none", "label_smoothing": 0.1}):
        assert torch.autograd.gradcheck(partial(loss, targets=t, **ce), (x,), eps=1e-6, atol=1e-8)
        ref = F.cross_entropy(x.reshape(-1, V), t.reshape(-1), **ce)
        got = loss(x, t, **ce)
        torch.testing.assert_close(got.reshape(ref.shape), ref, rtol=1e-12, atol=1e-12)


def check_bad_targets(V: int) -> None:
    emb = VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=8)
    logits = emb.attend(torch.randn(2, 3, D))
    for bad, text in ((V, f"target {V} at index (0, 1) is out of range [0, {V})"), (-1, "target -1"),
                      (emb.padded_vocab_size - 1, "out of range")):
        t = torch.zeros(2, 3, dtype=torch.long)
        t[0, 1] = bad
        msg = _raises(TokenIdError, lambda t=t: vocab_parallel_cross_entropy(logits, t, vocab_size=V))
        assert text in msg, msg
    _raises(TokenIdError, lambda: vocab_parallel_cross_entropy(logits, torch.zeros(2, 3), vocab_size=V))
    loss = vocab_parallel_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long), vocab_size=V)
    assert torch.isfinite(loss), "the group still works after the refused calls"
