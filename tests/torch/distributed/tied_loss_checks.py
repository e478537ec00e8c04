"""The vocab-parallel tied loss checks each rank runs: ``VocabParallelEmbedding.loss`` against one process's
``F.cross_entropy(h @ W.T)`` (float64: 1e-10), its collectives counted (3 all-reduces forward, 1 backward)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.torch.distributed.harness import CheckResults, run_checks
from tests.torch.distributed.rank_checks import SEED, D, _raises, count_all_reduce
from tokenpos.tables.errors import TokenIdError
from tokenpos.torch import TokenEmbedding
from tokenpos.torch.distributed import VocabParallelEmbedding

CASES = [  # (reduction, label_smoothing, softcap)
    ("mean", 0.0, None), ("sum", 0.1, None), ("none", 0.2, 2.0), ("mean", 0.1, 3.0),
]


def _targets(V: int, shape: tuple[int, ...]) -> torch.Tensor:
    t = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(4))
    t.view(-1)[:3] = torch.tensor([0, V - 1, -100])          # the first and last real rows, one ignored
    return t


def check_matches_one_process(V: int, pad: int, reduction: str, eps: float, cap: float | None) -> None:
    emb = VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=pad, dtype=torch.float64)
    ref = TokenEmbedding(V, D, seed=SEED, dtype=torch.float64)
    t = _targets(V, (2, 3))
    h0 = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    h, h_ref = h0.clone().requires_grad_(), h0.clone().requires_grad_()
    with count_all_reduce() as calls:
        loss = emb.loss(h, t, label_smoothing=eps, reduction=reduction, softcap=cap, chunk_size=2)
    fwd = calls[0]
    z = ref.attend(h_ref)
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    ref_loss = F.cross_entropy(z.reshape(-1, V), t.reshape(-1), label_smoothing=eps, reduction=reduction)
    ref_loss = ref_loss.reshape(t.shape) if reduction == "none" else ref_loss
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-10)
    weights = torch.randn(loss.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with count_all_reduce() as calls:
        (loss * weights).sum().backward()
    assert (fwd, calls[0]) == ((3, 1) if dist.get_world_size() > 1 else (0, 0)), (fwd, calls[0])
    (ref_loss * weights).sum().backward()
    n = emb.num_real_rows
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(emb.weight.grad[:n], ref.weight.grad[emb.vocab_start: emb.vocab_start + n],
                               rtol=1e-10, atol=1e-10)
    assert not emb.weight.grad[n:].any(), "padding rows get no gradient"


def check_all_ignored(V: int) -> None:
    emb = VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=8)
    h = torch.randn(2, 3, D, requires_grad=True)
    loss = emb.loss(h, torch.full((2, 3), -100), label_smoothing=0.1)
    loss.backward()
    assert loss.item() == 0.0 and not h.grad.any() and not emb.weight.grad.any()


def check_bad_targets(V: int) -> None:
    emb = VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=8)
    ref = TokenEmbedding(V, D, seed=SEED)
    h = torch.randn(1, 2, D)
    for bad in (torch.tensor([[0, V]]), torch.tensor([[-1, 0]]), torch.tensor([[0.0, 1.0]])):
        got = _raises(TokenIdError, lambda b=bad: emb.loss(h, b))
        assert got == _raises(TokenIdError, lambda b=bad: ref.loss(h, b)), got


def check_no_second_derivative(V: int) -> None:
    """A gradient penalty through the loss raises (its blocks are written with out=: an internal mm error before)."""
    emb = VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=8)
    h = torch.randn(2, 3, D, requires_grad=True)
    g, = torch.autograd.grad(emb.loss(h, _targets(V, (2, 3))), h, create_graph=True)
    assert _raises(RuntimeError, lambda: ((g ** 2).sum() + 0 * h.sum()).backward()).startswith(
        "tied_cross_entropy has no second derivative"), "second derivative"


def rank_main(rank: int, world: int) -> CheckResults:
    checks: list[tuple[str, Any]] = []
    for V, pad in ((1003, 1), (1003, 8), (50257, 1), (5, 8)):     # V=5, pad 8: at W = 4 a rank of padding only
        for reduction, eps, cap in CASES:
            checks.append((f"match_V{V}_pad{pad}_{reduction}_{eps}_{cap}",
                           partial(check_matches_one_process, V, pad, reduction, eps, cap)))
    checks += [("all_ignored", partial(check_all_ignored, 1003)), ("bad_targets", partial(check_bad_targets, 1003)),
               ("no_second_derivative", partial(check_no_second_derivative, 1003))]
    return run_checks(checks)
