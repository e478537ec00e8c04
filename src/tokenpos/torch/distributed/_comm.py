"""The process group and the two autograd-aware collectives of vocab parallelism (Megatron's f and g).

W world size of the group, r this rank. Every collective goes through ``torch.distributed.all_reduce``
(looked up at call time, so a test can wrap it and count the calls). At W = 1 nothing is issued.

- :func:`reduce_from_group`: forward all-reduce (sum), backward identity. Ends the embedding lookup,
  where each rank holds the rows of the ids it owns and zeros elsewhere.
- :func:`copy_to_group`: forward identity, backward all-reduce (sum). Starts the tied output
  projection, so ``h.grad`` sums every rank's contribution ``grad_logits_r @ W_r``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tokenpos.tables.errors import ConfigError


def resolve_group(group: Any = None) -> tuple[Any, int, int]:
    """``(group, rank, world_size)`` of ``group`` (None: the default world).

    Raises:
        ConfigError: torch.distributed is unavailable or not initialised, or this process is not in ``group``.
    """
    if not dist.is_available():
        raise ConfigError("torch.distributed is not available in this torch build; expected a build with it")
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised; call torch.distributed.init_process_group() "
                          "first (torchrun sets the environment), expected an initialised default group")
    g = dist.group.WORLD if group is None else group
    rank, world = dist.get_rank(g), dist.get_world_size(g)
    if rank < 0:
        raise ConfigError(f"this process (global rank {dist.get_rank()}) is not a member of the given group")
    return g, int(rank), int(world)


def all_reduce(t: torch.Tensor, group: Any, op: Any = None) -> torch.Tensor:
    """In-place all-reduce of ``t`` over ``group`` (sum unless ``op``); returns ``t``."""
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return t


def collective_device(group: Any) -> torch.device:
    """The device whose tensors a collective on ``group`` takes: the current CUDA device for an
    NCCL-only group (which refuses CPU tensors), else the CPU (gloo, mpi, or a "cpu:gloo,cuda:nccl"
    group). The one place a small collective of the layers (a seed, a flag) picks its device,
    whatever device the table is on (the CPU or meta while a model is built)."""
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_ranks_ok(ok: bool, group: Any, world: int) -> bool:
    """True when every rank of ``group`` passed ``ok`` (one all-reduce of a failure count on the group's
    :func:`collective_device`; none at W = 1)."""
    if world == 1:
        return ok
    flag = torch.zeros(1, device=collective_device(group))
    flag.fill_(0.0 if ok else 1.0)
    return float(all_reduce(flag, group)[0]) == 0.0


class _ReduceFromGroup(torch.autograd.Function):
    """x (...) -> sum over ranks of x (...); the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.clone(memory_format=torch.contiguous_format)
        return all_reduce(out, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None


class _CopyToGroup(torch.autograd.Function):
    """x (...) -> x (...); the gradient is summed over ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_reduce(grad.clone(memory_format=torch.contiguous_format), ctx.group), None


def reduce_from_group(x: torch.Tensor, group: Any, world: int) -> torch.Tensor:
    """Sum ``x`` over the ranks of ``group`` (one all-reduce in forward, none in backward)."""
    if world == 1:
        return x
    if torch.is_grad_enabled() and x.requires_grad:
        return _ReduceFromGroup.apply(x, group)
    return all_reduce(x.clone(memory_format=torch.contiguous_format), group)


def copy_to_group(x: torch.Tensor, group: Any, world: int) -> torch.Tensor:
    """``x`` unchanged; in backward its gradient is summed over ``group`` (one all-reduce)."""
    if world == 1 or not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _CopyToGroup.apply(x, group)
