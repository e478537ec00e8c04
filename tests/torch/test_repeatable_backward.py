"""Every public autograd entry gives the same bits on a repeated backward (``retain_graph``), and passes
``gradcheck`` in float64 without a non-determinism tolerance (issue 48, item 3).

The class of defect: a backward whose first call differs from its later ones (the eager tied loss handed over
its forward's gradients once, then recomputed them another way: 4e-17 apart in float64, so gradcheck's
reentrancy check failed). The guard runs over every ``ops.samples()`` entry that has an input requiring grad,
through the op (the dispatcher: ``torch.compile``'s path) and through its eager entry (what the layers call):
``embed``, ``rotate``, ``rotate_qk``, the tied loss's ``TiedLoss`` and the public ``tied_cross_entropy``. The
vocab-parallel losses run the same check at W = 1, 2 and 3 (tests/torch/distributed/test_refusals.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import tokenpos.torch as tpt
import tokenpos.torch.ops as ops
from tests.torch.op_inputs import with_inputs
from tokenpos.torch.ops.tied_loss import TiedLoss

pytestmark = pytest.mark.slow   # about 190 cases, each a forward and three backwards
SAMPLES = list(ops.samples())


def _public_tied_loss(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, ignore_index: int, eps: float,
                      reduction: str, cap: float | None, chunk: int | None, _with_grad: bool) -> torch.Tensor:
    return tpt.tied_cross_entropy(h, w, t, ignore_index=ignore_index, label_smoothing=eps, reduction=reduction,
                                  softcap=cap, chunk_size=chunk)


#: each op's eager entry, called with the op's own arguments (ops without one run through the op alone)
EAGER: dict[str, list[Callable[..., Any]]] = {
    "embedding": [ops.embed],
    "rope": [ops.rotate],
    "rope_qk": [ops.rotate_qk],
    "tied_cross_entropy": [lambda *a: TiedLoss.apply(*a), _public_tied_loss],
}


#: ops the layers call through the dispatcher in eager mode too (no eager entry of their own)
OP_ONLY = {"ngram_embedding"}


def _grad_inputs(args: tuple[Any, ...]) -> list[int]:
    return [j for j, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]


def _cases() -> list[Any]:
    """(sample, op or eager entry) for every float64 sample with an input requiring grad (the float32 ones take
    the same paths)."""
    out = []
    for i, (op, args, _) in enumerate(SAMPLES):
        if not _grad_inputs(args) or args[0].dtype != torch.float64:
            continue
        name = op._name.split("::")[-1]
        out.append(pytest.param(i, op, id=f"{i}-{name}-op"))
        for k, fn in enumerate(EAGER.get(name, [])):
            out.append(pytest.param(i, fn, id=f"{i}-{name}-eager{k}"))
    return out


CASES = _cases()


def _outputs(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(o for o in (x if isinstance(x, (tuple, list)) else (x,))
                 if isinstance(o, torch.Tensor) and o.requires_grad)


def test_every_op_with_an_eager_entry_is_listed() -> None:
    names = {op._name.split("::")[-1] for op, args, _ in SAMPLES if _grad_inputs(args)}
    assert {n for n in names if not n.endswith("_backward")} <= set(EAGER) | OP_ONLY, names


@pytest.mark.parametrize(("i", "fn"), CASES)
def test_a_repeated_backward_gives_the_same_bits(i: int, fn: Callable[..., Any]) -> None:
    _, args, _ = SAMPLES[i]
    idx = _grad_inputs(args)
    xs = tuple(args[j].detach().clone().requires_grad_() for j in idx)
    outs = _outputs(with_inputs(fn, args, idx)(*xs))
    gen = torch.Generator().manual_seed(i)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
    assert isinstance(loss, torch.Tensor)
    first = torch.autograd.grad(loss, xs, retain_graph=True, allow_unused=True)
    again = torch.autograd.grad(loss, xs, retain_graph=True, allow_unused=True)
    third = torch.autograd.grad(loss, xs, allow_unused=True)
    for a, b, c in zip(first, again, third, strict=True):
        assert (a is None) == (b is None) == (c is None)
        if a is not None:
            assert torch.equal(a, b) and torch.equal(a, c), (a - b).abs().max()


def _gradcheck_cases() -> list[Any]:
    """The tied loss's eager entries on every float64 sample (its options change its backward's path: reduction,
    smoothing, soft-cap, chunks). RoPE's and the embedding's eager entries are gradchecked in test_op_contracts.py
    (``test_the_layers_route_gives_cos_and_sin_the_ops_gradients``, test_ops.py); their reentrancy, which is what
    gradcheck would add here, is the bitwise test above."""
    return [c for c in CASES if "tied_cross_entropy-eager" in str(c.id)]


@pytest.mark.parametrize(("i", "fn"), _gradcheck_cases())
def test_gradcheck_every_eager_entry_without_a_tolerance(i: int, fn: Callable[..., Any]) -> None:
    """The ops themselves pass gradcheck in test_op_contracts.py; the entries the layers call, here, in float64
    (gradcheck's reentrancy check compares two backwards with nondet_tol=0)."""
    _, args, _ = SAMPLES[i]
    if args[0].dim() and fn is ops.embed:
        args = (*args[:-1], -1)                  # padding_idx: read by the forward, no gradient by design
    idx = _grad_inputs(args)
    xs = tuple(args[j].detach().clone().requires_grad_() for j in idx)
    assert torch.autograd.gradcheck(with_inputs(fn, args, idx), xs)
