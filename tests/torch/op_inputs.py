"""Calling an op with some of its arguments replaced: the form ``torch.autograd.gradcheck`` (and a repeated
backward) wants, a function of the differentiable inputs alone (tests/torch/test_op_contracts.py,
tests/torch/test_repeatable_backward.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def with_inputs(fn: Callable[..., Any], args: tuple[Any, ...], idx: list[int]) -> Callable[..., Any]:
    """``run(*xs)`` = ``fn(*args)`` with ``args[idx[i]]`` replaced by ``xs[i]`` (the others as given)."""
    def run(*xs: torch.Tensor) -> Any:
        full = list(args)
        for j, x in zip(idx, xs, strict=True):
            full[j] = x
        return fn(*full)
    return run
