"""First-order-only backwards: a gradient made with ``create_graph=True`` whose second derivative raises.

The tied loss (``tokenpos::tied_cross_entropy`` and its eager and vocab-parallel twins) writes its blocks of logits
with ``out=`` and keeps no graph of its own backward, so it has no second derivative. Without a mark, a gradient
penalty through it was silently zero; ``torch.autograd.function.once_differentiable`` marks the gradients only
when the incoming gradient requires grad, which a loss's does not. :func:`first_order` ties them to the loss's
inputs instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

SECOND_DERIVATIVE_MESSAGE = ("tied_cross_entropy has no second derivative (a gradient penalty through "
                             "create_graph=True); use F.cross_entropy(h @ weight.T, targets) for that term")


class _NoSecondDerivative(torch.autograd.Function):
    """Identity on a first-order gradient made with ``create_graph=True``, tied to the loss's inputs (``anchors``:
    h, weight), whose backward raises: a second derivative through the tied loss fails loudly."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(SECOND_DERIVATIVE_MESSAGE)


def first_order(backward: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    """A backward of the tied loss (its ctx saves h and weight first): run without building a graph; under
    ``create_graph=True`` its gradients go through :class:`_NoSecondDerivative`. (``once_differentiable`` marks
    them only when the incoming gradient requires grad, which a loss's does not: a gradient penalty on them was
    silently zero.)"""
    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return out
        anchors = [t for t in ctx.saved_tensors[:2] if t.requires_grad]
        if not anchors:
            return out
        return tuple(_NoSecondDerivative.apply(g, *anchors) if isinstance(g, torch.Tensor) else g for g in out)
    return wrapper
