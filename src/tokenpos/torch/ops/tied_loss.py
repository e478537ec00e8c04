"""``tokenpos::tied_cross_entropy`` and ``tokenpos::tied_cross_entropy_backward``: the tied output projection
and its cross-entropy as torch custom ops, never holding more than one (c, V) block of logits.

Shapes: h (..., D) flattened to (N, D), weight (V, D), targets (...) flattened to (N,), c = chunk_size tokens,
Vl <= V the columns of this call (the vocab-parallel loss passes its shard and its real columns).

    forward:  loss = F.cross_entropy(cap(h @ weight.T), targets, ...), lse (N,) kept for backward
    backward: (dh, dweight), recomputing each block of logits from h, weight and lse

Formulas: ``tokenpos.tables.formulas.tied_loss`` (soft-cap, label smoothing, "mean" over the non-ignored
targets, all ignored -> 0). Arithmetic in float32 (fp16 / bf16 inputs, the table cast once per call) or
float64; loss and lse in that compute dtype, gradients in the inputs' dtype.

Every device runs the same chunked loop: each block is a matmul (BLAS on the CPU, cuBLAS on CUDA; the
matmuls are the work), then the block's soft-cap, log-sum-exp and gradient in place (:mod:`.tied_loss_blocks`):
on CUDA by the Triton block kernel ``kernels.triton.tied_loss`` (Liger-Kernel's design); on the CPU, with
kernels off, for dtypes the kernel does not take and under ``torch.func``, by plain torch ops (the
reference the Triton kernel is tested against; a numba CPU kernel measured no faster and was deleted,
issue 33). Blocks run in token order and dweight is accumulated block after block (``addmm_``), so the
CPU result is bit-identical run to run. On CUDA: one launch per op per block, no host sync (the token
count of "mean" stays on the device); the Triton kernel uses no atomics, but cuBLAS may pick split
reductions, so bit-identity there is cuBLAS's (``torch.use_deterministic_algorithms``).

Each op (and its fake) checks shapes, dtypes and devices first (``tables.checks.tied_loss``); the target
values are checked in the op's implementation (a TokenIdError on the CPU, a device-side assert elsewhere).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.tied_loss import (
    check_options,
    check_same_dtype,
    check_shapes,
    mismatch_message,
    target_dtype_message,
)
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.torch._checks import _INT_DTYPES, check_target_values
from tokenpos.torch.ops.first_order import first_order
from tokenpos.torch.ops.tied_loss_blocks import compute_dtype, local_grads, local_pass, reduce_loss, token_weights

# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------


def check_tensors(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                  ignore_index: int) -> None:
    """Shapes, dtypes and devices (no values): h (..., D) and weight (V, D) of one float dtype and device,
    integer targets of h's shape without its last axis.

    Raises:
        DtypeError: two dtypes. ConfigError: two devices, or shapes that do not fit. TokenIdError: non-integer targets.
    """
    check_same_dtype(h.dtype, weight.dtype)
    if h.device != weight.device or targets.device != weight.device:
        raise ConfigError(mismatch_message("device", h.device, weight.device)
                          + ("" if targets.device == weight.device else f" (targets on {targets.device})"))
    if targets.dtype not in _INT_DTYPES:
        raise TokenIdError(target_dtype_message(targets.dtype, vocab_size, ignore_index))
    check_shapes(tuple(h.shape), tuple(weight.shape), tuple(targets.shape))


def check_op_args(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                  label_smoothing: float, reduction: str, softcap: float | None, chunk_size: int | None) -> None:
    """The ops' (and fakes') one argument check: ``check_tensors`` and the options (no values read)."""
    check_options(ignore_index, label_smoothing, reduction, softcap, chunk_size)
    check_tensors(h, weight, targets, weight.shape[0], ignore_index)


# ----------------------------------------------------------------------------------------------
# the ops
# ----------------------------------------------------------------------------------------------


def _flat(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    c = compute_dtype(h.dtype)
    return h.reshape(-1, h.shape[-1]).to(c), weight.to(c), targets.reshape(-1).long()


def _loss_shape(targets: torch.Tensor, reduction: str) -> tuple[int, ...]:
    return tuple(targets.shape) if reduction == "none" else ()


@torch.library.custom_op("tokenpos::tied_cross_entropy", mutates_args=())
def tied_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                       label_smoothing: float, reduction: str, softcap: float | None, chunk_size: int | None,
                       with_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (..., D), weight (V, D), targets (...) -> (loss () or (...) for "none", lse (N,), dh, dweight).

    loss and lse in the compute dtype. With ``with_grad`` (reductions "mean" and "sum" only), dh (..., D) and
    dweight (V, D) are the gradients of the loss itself (d loss = 1), from the same blocks of logits (three
    matmuls per block in all, none recomputed; the autograd backward scales them); otherwise both are empty (0,)
    and the backward op recomputes the blocks from lse.
    """
    check_op_args(h, weight, targets, ignore_index, label_smoothing, reduction, softcap, chunk_size)
    check_with_grad(with_grad, reduction)
    check_target_values(targets, weight.shape[0], ignore_index)
    return forward_impl(h, weight, targets, ignore_index, label_smoothing, reduction, softcap, chunk_size, with_grad)


def forward_impl(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, eps: float,
                 reduction: str, softcap: float | None, chunk_size: int | None,
                 with_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`tied_cross_entropy`'s computation on checked arguments (the op and the eager entry call it)."""
    V = weight.shape[0]
    h2, w, t = _flat(h, weight, targets)
    valid = t != ignore_index
    coef = token_weights(torch.ones((), dtype=h2.dtype, device=h2.device), valid, reduction, h2.dtype) \
        if with_grad else None
    m, s, zt, zsum, dh, dw = local_pass(h2, w, t, valid, eps, V, softcap, chunk_size, coef)
    lse = s.log_().add_(m)
    per = lse - zt
    if zsum is not None:
        per = (1.0 - eps) * per + eps * (lse - zsum / V)
    per = torch.where(valid, per, torch.zeros_like(per))
    loss = reduce_loss(per, valid, reduction, tuple(targets.shape))
    if dh is None or dw is None:
        return loss, lse, h.new_empty((0,)), weight.new_empty((0,))
    return loss, lse, dh.to(h.dtype).reshape(h.shape), dw.to(weight.dtype)


def check_with_grad(with_grad: bool, reduction: str) -> None:
    """``with_grad`` only for a scalar loss (reduction "none" needs each token's d loss: the backward op).

    Raises:
        ConfigError: with_grad with reduction "none".
    """
    if with_grad and reduction == "none":
        raise ConfigError('with_grad=True needs reduction "mean" or "sum", got "none" (its gradient depends on '
                          "each token's d loss: the backward op computes it)")


@torch.library.custom_op("tokenpos::tied_cross_entropy_backward", mutates_args=())
def tied_cross_entropy_backward(grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                lse: torch.Tensor, ignore_index: int, label_smoothing: float, reduction: str,
                                softcap: float | None, chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of :func:`tied_cross_entropy`'s loss: grad (() or (...)) -> (dh (..., D), dweight (V, D))."""
    check_op_args(h, weight, targets, ignore_index, label_smoothing, reduction, softcap, chunk_size)
    return backward_impl(grad, h, weight, targets, lse, ignore_index, label_smoothing, reduction, softcap, chunk_size)


def backward_impl(grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  ignore_index: int, label_smoothing: float, reduction: str, softcap: float | None,
                  chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tied_cross_entropy_backward`'s computation on checked arguments (recomputes the blocks from lse)."""
    V = weight.shape[0]
    h2, w, t = _flat(h, weight, targets)
    valid = t != ignore_index
    coef = token_weights(grad, valid, reduction, h2.dtype)
    dh, dw = local_grads(h2, w, lse.to(h2.dtype), t, valid, coef, label_smoothing, V, softcap, chunk_size)
    return dh.to(h.dtype).reshape(h.shape), dw.to(weight.dtype)


@tied_cross_entropy.register_fake
def _fake(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, label_smoothing: float,
          reduction: str, softcap: float | None, chunk_size: int | None,
          with_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    check_op_args(h, weight, targets, ignore_index, label_smoothing, reduction, softcap, chunk_size)
    check_with_grad(with_grad, reduction)
    c = compute_dtype(h.dtype)
    loss, lse = h.new_empty(_loss_shape(targets, reduction), dtype=c), h.new_empty((targets.numel(),), dtype=c)
    if not with_grad:
        return loss, lse, h.new_empty((0,)), weight.new_empty((0,))
    return (loss, lse, torch.empty_like(h, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


@tied_cross_entropy_backward.register_fake
def _fake_backward(grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   lse: torch.Tensor, ignore_index: int, label_smoothing: float, reduction: str,
                   softcap: float | None, chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    check_op_args(h, weight, targets, ignore_index, label_smoothing, reduction, softcap, chunk_size)
    return (torch.empty_like(h, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    h, weight, targets = inputs[:3]
    ctx.with_grad = inputs[-1]
    ctx.save_for_backward(h, weight, targets, *output[1:])            # (dh, dweight empty without with_grad)
    ctx.options = inputs[3:-1]
    ctx.mark_non_differentiable(*output[1:])


@first_order
def _backward(ctx: Any, grad: torch.Tensor, *_rest: Any) -> tuple[Any, ...]:
    """First order only (:func:`first_order`): the saved gradients (with_grad) or the backward op."""
    h, weight, targets, lse, dh, dw = ctx.saved_tensors
    if ctx.with_grad:
        dh, dw = (dh * grad).to(dh.dtype), (dw * grad).to(dw.dtype)
    else:
        dh, dw = torch.ops.tokenpos.tied_cross_entropy_backward(grad, h, weight, targets, lse, *ctx.options)
    return (dh if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
            None, None, None, None, None, None, None)


tied_cross_entropy.register_autograd(_backward, setup_context=_setup)


class TiedLoss(torch.autograd.Function):
    """The eager entry (``tokenpos.torch.tied_cross_entropy`` outside ``torch.compile`` and ``torch.func``): the
    op's implementations without the dispatcher, returning the loss only. With ``with_grad`` its first backward
    hands over the forward's gradients, scaled in place (no second (V, D) table, which an op's traced backward
    must make); a second backward through the same graph (``retain_graph``) makes them again by the forward's own
    computation (the same blocks in the same order, then the same scaling), so every backward gives the same
    bits and ``gradcheck`` passes without a non-determinism tolerance. First order only (:func:`first_order`: a
    second derivative raises)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                eps: float, reduction: str, softcap: float | None, chunk_size: int | None,
                with_grad: bool) -> torch.Tensor:
        loss, lse, dh, dw = forward_impl(h, weight, targets, ignore_index, eps, reduction, softcap, chunk_size,
                                         with_grad)
        ctx.grads = [(dh, dw)] if with_grad else []          # intermediates, handed over once (not saved tensors)
        ctx.with_grad = with_grad
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.options = (ignore_index, eps, reduction, softcap, chunk_size)
        return loss

    @staticmethod
    @first_order
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        h, weight, targets, lse = ctx.saved_tensors          # the version check: weight not changed in place since
        if ctx.with_grad:
            # the forward's gradients (at d loss = 1) once; a repeated backward (retain_graph) makes them again
            # the same way (the same blocks, the same order), so every backward gives the same bits
            ignore_index, eps, reduction, softcap, chunk_size = ctx.options
            dh, dw = ctx.grads.pop() if ctx.grads else forward_impl(h, weight, targets, ignore_index, eps, reduction,
                                                                    softcap, chunk_size, True)[2:]
            dh, dw = dh.mul_(grad), dw.mul_(grad)            # grad as it is: a loss scale may not fit h's dtype
        else:
            dh, dw = backward_impl(grad, h, weight, targets, lse, *ctx.options)
        return (dh if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
                None, None, None, None, None, None, None)
