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

from tokenpos.tables.errors import ConfigError, DtypeError, KernelBoundError, PositionError, TokenIdError
from tokenpos.torch._init import torch_seed


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


AGREED_ERRORS: tuple[type[ValueError], ...] = (KernelBoundError, TokenIdError, PositionError, DtypeError, ConfigError)
"""The refusals :func:`raise_together` carries over a group (most specific first: its code is the first match)."""


def raise_together(error: BaseException | None, group: Any, world: int, what: str) -> None:
    """Raise on every rank of ``group`` when any rank refused ``what``, else return: this rank's own ``error``,
    or, on a rank that had none, an error of the class another rank raised (its code in
    :data:`AGREED_ERRORS`; the most specific when ranks differ) saying so. One all-reduce (max) of that code
    on the group's :func:`collective_device`; none at W = 1. ``error`` must be one of :data:`AGREED_ERRORS`.
    """
    if world == 1:
        if error is not None:
            raise error
        return
    code = 0 if error is None else next(i + 1 for i, c in enumerate(AGREED_ERRORS) if isinstance(error, c))
    flag = torch.zeros(1, dtype=torch.int64, device=collective_device(group))
    flag.fill_(len(AGREED_ERRORS) + 1 - code if code else 0)          # max picks the smallest (most specific) code
    agreed = int(all_reduce(flag, group, dist.ReduceOp.MAX)[0])
    if error is not None:
        raise error
    if agreed:
        cls = AGREED_ERRORS[len(AGREED_ERRORS) - agreed]
        raise cls(f"another rank of the group refused its {what} (a {cls.__name__}); every rank refuses the call "
                  f"together and nothing was computed; expected the same valid {what} on every rank")


def shared_seed(group: Any, rank: int, world: int, generator: torch.Generator | None = None) -> int:
    """A seed drawn by rank 0 from ``generator`` (torch's default generator when None) and given to every rank of
    ``group`` (one all-reduce; none at W = 1). Only rank 0's generator advances, so every shard comes from the one
    table a one-process layer draws from rank 0's generator."""
    seed = torch_seed(generator) if rank == 0 else 0
    if world > 1:
        # on the device the group's backend takes (CUDA for NCCL), whatever the table's (CPU, meta)
        shared = torch.zeros(1, dtype=torch.int64, device=collective_device(group))
        shared.fill_(seed)
        seed = int(all_reduce(shared, group)[0])
    return seed


class _ReduceFromGroup(torch.autograd.Function):
    """x (...) -> sum over ranks of x (...); the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, in_place: bool) -> torch.Tensor:
        if in_place:
            ctx.mark_dirty(x)
            return all_reduce(x, group)
        out = x.clone(memory_format=torch.contiguous_format)
        return all_reduce(out, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None, None


class _CopyToGroup(torch.autograd.Function):
    """x (...) -> x (...); the gradient is summed over ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_reduce(grad.clone(memory_format=torch.contiguous_format), ctx.group), None


def reduce_from_group(x: torch.Tensor, group: Any, world: int, *, in_place: bool = False) -> torch.Tensor:
    """Sum ``x`` over the ranks of ``group`` (one all-reduce in forward, none in backward). ``in_place``: ``x`` is
    a fresh contiguous tensor of the caller's, summed where it is (no copy; autograd sees it modified)."""
    if world == 1:
        return x
    in_place = in_place and x.is_contiguous()
    if torch.is_grad_enabled() and x.requires_grad:
        return _ReduceFromGroup.apply(x, group, in_place)
    return all_reduce(x if in_place else x.clone(memory_format=torch.contiguous_format), group)


def copy_to_group(x: torch.Tensor, group: Any, world: int) -> torch.Tensor:
    """``x`` unchanged; in backward its gradient is summed over ``group`` (one all-reduce)."""
    if world == 1 or not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _CopyToGroup.apply(x, group)
