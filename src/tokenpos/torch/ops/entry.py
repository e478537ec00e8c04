"""The calls the layers make: :func:`embed`, :func:`rotate`, :func:`rotate_qk`.

Each runs its op, reached the cheapest way that keeps the op's semantics:

- under ``torch.compile`` tracing: the custom op itself (``torch.ops.tokenpos.*``), so the graph
  keeps it (and its fake / autograd registrations);
- in eager mode: the op's own implementation (``forward_impl`` / ``rotate_impl``), called directly.
  With autograd, through a small ``autograd.Function`` whose backward is the backward *op*
  (``tokenpos::embedding_backward`` / ``tokenpos::rope_backward``), so double backward works as with the op.
  This skips the Python the custom-op dispatcher spends per call with autograd (argument binding,
  its generated autograd Function: 60 us more than this route on the 2-vCPU EPYC guest,
  benchmarks/HISTORY.md);
- under ``torch.func`` transforms (grad, vmap of grad, jacrev...): the implementation too, which
  then runs its formula in differentiable torch ops, because a custom op's autograd cannot run at
  a transform's grad level.

Every route computes the same values with the same dropout masks (tests/torch/test_ops.py). The
layers check their inputs at their public entry and hand these functions valid arguments; the
ops themselves (``torch.ops.tokenpos.*``, a public boundary too) check theirs (``tables.checks.ops``:
shapes, dtypes and scalars, no tensor values) before choosing an implementation.
Shapes: as the ops (``embedding``: weight (V, D), ids (...) -> (..., D); ``rope``: (B, H, L, Dh)).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tokenpos.torch._checks import transforms_active
from tokenpos.torch.ops.embedding import formula, forward_impl
from tokenpos.torch.ops.rope import rope_grads, rotate_impl, rotate_qk_impl, save_rope


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, table: torch.Tensor | None, ids: torch.Tensor,
                pos: torch.Tensor | None, scale: float, p: float, seed: torch.Tensor, padding_idx: int) -> Any:
        ctx.save_for_backward(ids, pos, seed)
        ctx.args = (weight.shape[0], 0 if table is None else table.shape[0], scale, p, padding_idx)
        return forward_impl(weight, ids, table, pos, scale, p, seed, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        ids, pos, seed = ctx.saved_tensors
        V, P, scale, p, padding_idx = ctx.args
        P = P if ctx.needs_input_grad[1] else 0
        gw, gt = torch.ops.tokenpos.embedding_backward(grad, ids, pos if P else None, V, P, scale, p, seed,
                                                       padding_idx)
        return (gw if ctx.needs_input_grad[0] else None), (gt if P else None), None, None, None, None, None, None


@functools.lru_cache(maxsize=16)
def _zero(device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):   # a normal tensor (autograd saves it)
        return torch.zeros((), dtype=torch.int64, device=device)


def no_seed(like: torch.Tensor) -> torch.Tensor:
    """The 0-d int64 seed of a call without dropout, on ``like``'s device: one shared zero per device,
    so a call launches no kernel for it. A caller can reach it through a graph's
    ``grad_fn.saved_tensors``, so if it was written there (its version counter moved) a fresh zero
    replaces it. Traced by torch.compile, it is a zero made in the graph (free there): dynamo traces
    through a cache without honouring it, and warns that it does."""
    if torch.compiler.is_compiling():
        return torch.zeros((), dtype=torch.int64, device=like.device)
    seed = _zero(like.device)
    if seed._version:
        _zero.cache_clear()
        seed = _zero(like.device)
    return seed


SMALL_BYTES = 1 << 16
"""An eager CPU call without autograd or dropout whose output is under this many bytes is torch's own gather
(``torch.embedding``, :func:`.embedding.formula`): at a decode step's size (a few KB) the kernel's host cost
(NumPy views, an output block, the launch: 5-10 us) is several times the gather, and torch's gather checks
every index in its kernel for free. Larger outputs take the op's fused kernel, whose one pass wins from there
on (the gather, scale and positional add are two or three torch passes; benchmarks/HISTORY.md, 2026-11-29)."""


def embed(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None = None,
          pos: torch.Tensor | None = None, scale: float = 1.0, p: float = 0.0,
          seed: torch.Tensor | None = None, padding_idx: int = -1) -> torch.Tensor:
    """``tokenpos::embedding``: dropout(weight[ids] * scale + table[pos]) -> (..., D) (module doc), on
    ids and positions of a valid dtype and shape (their values are read where they are gathered: one outside
    its table raises ``KernelBoundError``). ``seed``: None without dropout."""
    if torch.compiler.is_compiling():
        return torch.ops.tokenpos.embedding(weight, ids, table, pos, scale, p, no_seed(weight) if seed is None
                                            else seed, padding_idx)
    if (torch.is_grad_enabled() and not transforms_active()
            and (weight.requires_grad or (table is not None and table.requires_grad))):
        return _Embedding.apply(weight, table, ids, pos, scale, p,  # type: ignore[no-any-return]
                                no_seed(weight) if seed is None else seed, padding_idx)
    if not p and weight.is_cpu and ids.numel() * weight.shape[1] * weight.element_size() < SMALL_BYTES:
        return formula(weight, ids, table, pos, scale, 0.0, None, padding_idx)     # small: torch's own gather
    return forward_impl(weight, ids, table, pos, scale, p, no_seed(weight) if seed is None else seed,
                        padding_idx)                                        # (transforms: torch ops)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                positions: torch.Tensor | None) -> Any:
        save_rope(ctx, (x,), cos, sin, interleaved, False, positions)
        return rotate_impl(x, cos, sin, interleaved, False, positions)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return rope_grads(ctx, grad)                     # x: the transpose op; cos / sin when they need it


class _RopeQK(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                interleaved: bool, positions: torch.Tensor | None) -> Any:
        ctx.set_materialize_grads(True)
        save_rope(ctx, (q, k), cos, sin, interleaved, False, positions)
        oq, ok = rotate_qk_impl(q, k, cos, sin, interleaved, False, positions)
        tables = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        for out, needs in ((oq, ctx.needs_input_grad[0]), (ok, ctx.needs_input_grad[1])):
            if not (needs or tables):                   # as plain torch: x' requires grad iff x (or a table) does
                ctx.mark_non_differentiable(out)
        return oq, ok

    @staticmethod
    def backward(ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor) -> tuple[Any, ...]:
        return rope_grads(ctx, grad_q, grad_k)         # q and k: one transpose pass


def _tables_need_grad(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    return cos.requires_grad or sin.requires_grad


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
           positions: torch.Tensor | None = None) -> torch.Tensor:
    """``tokenpos::rope``: x (B, H, L, Dh) rotated by cos / sin (L, F) or (B, L, F), or (P, F) read at
    ``positions`` (L,) / (1, L) / (B, L) -> (B, H, L, Dh)."""
    if torch.compiler.is_compiling():
        return torch.ops.tokenpos.rope(x, cos, sin, interleaved, positions)
    if torch.is_grad_enabled() and not transforms_active() and (x.requires_grad or _tables_need_grad(cos, sin)):
        return _Rope.apply(x, cos, sin, interleaved, positions)  # type: ignore[no-any-return]
    return rotate_impl(x, cos, sin, interleaved, False, positions)                      # (transforms: torch ops)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              interleaved: bool = False, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokenpos::rope_qk``: q (B, H, L, Dh) and k (B, Hk, L, Dh) in one pass -> (q', k') (tables as
    :func:`rotate`'s)."""
    if torch.compiler.is_compiling():
        return torch.ops.tokenpos.rope_qk(q, k, cos, sin, interleaved, positions)
    if (torch.is_grad_enabled() and not transforms_active()
            and (q.requires_grad or k.requires_grad or _tables_need_grad(cos, sin))):
        return _RopeQK.apply(q, k, cos, sin, interleaved, positions)  # type: ignore[no-any-return]
    return rotate_qk_impl(q, k, cos, sin, interleaved, False, positions)                # (transforms: torch ops)
