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
matmuls are the work), then the block's soft-cap, log-sum-exp and gradient in place: on CUDA by the Triton
block kernel ``kernels.triton.tied_loss`` (:func:`block_kernel`, Liger-Kernel's design); on the CPU, with
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

import functools
from collections.abc import Callable
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
from tokenpos.tables.formulas.tied_loss import default_chunk_size
from tokenpos.torch._checks import _INT_DTYPES, check_target_values, transforms_active
from tokenpos.torch.ops._dispatch import triton_kernels

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
# the chunked computation (shared with the vocab-parallel loss)
# ----------------------------------------------------------------------------------------------


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for fp16 / bf16 / float32, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


class _Blocks:
    """The one or two (c, Vl) buffers a call's blocks are written into (``out=``), reused block after block: a
    fresh 64 MiB tensor per block would page-fault its memory every time (as slow as the matmul on the CPU)."""

    def __init__(self, h: torch.Tensor, w: torch.Tensor, step: int, softcap: float | None) -> None:
        rows = min(step, h.shape[0])
        self.z = torch.empty((rows, w.shape[0]), dtype=h.dtype, device=h.device)
        self.th = torch.empty_like(self.z) if softcap is not None else None
        self.w, self.softcap = w, softcap

    def logits(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h (c, D) -> (capped logits (c, Vl), tanh (c, Vl) or None), views of the buffers."""
        z = torch.mm(h, self.w.T, out=self.z[:h.shape[0]])
        if self.th is None or self.softcap is None:
            return z, None
        th = torch.div(z, self.softcap, out=self.th[:h.shape[0]]).tanh_()
        return torch.mul(th, self.softcap, out=z), th


def local_pass(h: torch.Tensor, w: torch.Tensor, local_t: torch.Tensor, here: torch.Tensor, eps: float,
               vocab_size: int, softcap: float | None, chunk_size: int | None, coef: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                          torch.Tensor | None, torch.Tensor | None]:
    """One pass over the blocks of logits of h (N, D) against w (Vl, D) (compute dtype, Vl >= 1), per token:
    (max m, sum exp(z - m), z at the target where ``here`` else 0, sum of z (eps > 0) or None), each (N,); and,
    given each token's gradient weight ``coef`` (N,), the gradients (dh (N, D), dweight (Vl, D)) of
    ``sum_n coef_n loss_n`` from the same blocks (w holds every column: lse is known per block), else None.

    local_t (N,) int64 target columns, here (N,) bool (the target is one of w's rows).
    """
    N = h.shape[0]
    m = torch.empty(N, dtype=h.dtype, device=h.device)
    s, zt = torch.empty_like(m), torch.empty_like(m)
    zsum = torch.empty_like(m) if eps > 0.0 else None
    dh = torch.empty_like(h) if coef is not None else None
    dw = torch.zeros_like(w) if coef is not None else None
    idx = torch.where(here, local_t, torch.zeros_like(local_t)).unsqueeze(1)          # (N, 1)
    kernel = block_kernel(h)
    cols = torch.where(here, local_t, torch.full_like(local_t, -1))                    # (N,) -1: not here
    step = _step(chunk_size, w)
    blocks = _Blocks(h, w, step, None if kernel else softcap)
    for i in range(0, N, step):
        hc = h[i:i + step]
        z, th = blocks.logits(hc)
        j = i + z.shape[0]
        if kernel:                                       # the block's stats (and gradient) in place
            st = kernel(z, cols[i:j], None if coef is None else coef[i:j], None, eps, vocab_size, softcap)
            m[i:j], s[i:j], zt[i:j] = st[:, 0], st[:, 1], st[:, 2]
            if zsum is not None:
                zsum[i:j] = st[:, 3]
            if dh is not None and dw is not None:
                _matmuls(z, w, hc, dh[i:j], dw)
            continue
        zt[i:j] = z.gather(1, idx[i:j]).squeeze(1)
        if zsum is not None:
            zsum[i:j] = z.sum(dim=1)
        mc = z.amax(dim=1)
        m[i:j] = mc
        e = z.sub_(mc.unsqueeze(1)).exp_()
        s[i:j] = e.sum(dim=1)
        if coef is not None and dh is not None and dw is not None:
            g = e.mul_((coef[i:j] / s[i:j]).unsqueeze(1))                              # coef * softmax (c, Vl)
            _grad_block(g, th, idx[i:j], here[i:j], coef[i:j], eps, vocab_size, w, hc, dh[i:j], dw)
    zt = torch.where(here, zt, torch.zeros_like(zt))
    return m, s, zt, zsum, dh, dw


def _grad_block(g: torch.Tensor, th: torch.Tensor | None, idx: torch.Tensor, here: torch.Tensor, coef: torch.Tensor,
                eps: float, vocab_size: int, w: torch.Tensor, hc: torch.Tensor, dh: torch.Tensor,
                dw: torch.Tensor) -> None:
    """block g = coef * softmax (c, Vl) -> ``coef * (softmax - (1 - eps) [v == t] - eps / V) * cap'`` in place;
    writes its dh rows (c, D) and adds its dweight (Vl, D) (``addmm_``: blocks in token order, a fixed order)."""
    g.scatter_add_(1, idx, (here.to(g.dtype) * coef * -(1.0 - eps)).unsqueeze(1))    # one column per row
    if eps > 0.0:
        g.sub_((coef * (eps / vocab_size)).unsqueeze(1))
    if th is not None:
        g.mul_(th.mul_(th).neg_().add_(1.0))                                           # 1 - tanh^2, in place
    _matmuls(g, w, hc, dh, dw)


def _matmuls(g: torch.Tensor, w: torch.Tensor, hc: torch.Tensor, dh: torch.Tensor, dw: torch.Tensor) -> None:
    """A block's gradient g (c, Vl) -> its dh rows (c, D) = g @ w, and dweight (Vl, D) += g.T @ hc."""
    torch.mm(g, w, out=dh)
    dw.addmm_(g.T, hc)


BlockKernel = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", float, int,
                        "float | None"], torch.Tensor]


def block_kernel(h: torch.Tensor) -> BlockKernel | None:
    """The kernel that turns a block of logits (h's compute dtype, on CUDA) into its stats and gradient in
    place (``kernels.triton.tied_loss``), or None: plain torch ops (the CPU, every other device, kernels off,
    a dtype the kernel does not take: ``ops._dispatch.triton_kernels``'s choice; and under ``torch.func``
    transforms, where a tensor's values cannot reach a kernel)."""
    if h.device.type == "cuda" and not transforms_active() and triton_kernels(h) is not None:
        return _triton_block
    return None


def _triton_block(z: torch.Tensor, t: torch.Tensor, coef: torch.Tensor | None, lse: torch.Tensor | None,
                  eps: float, vocab_size: int, softcap: float | None) -> torch.Tensor:
    return triton_kernels(z).tied_loss_block(z, t, coef=coef, lse=lse, eps=eps, vocab_size=vocab_size,
                                             softcap=softcap)


def _step(chunk_size: int | None, w: torch.Tensor) -> int:
    """Tokens per block: ``chunk_size``, or the default for w's Vl columns (``default_chunk_size``)."""
    return chunk_size or default_chunk_size(w.shape[0])


def local_grads(h: torch.Tensor, w: torch.Tensor, lse: torch.Tensor, local_t: torch.Tensor, here: torch.Tensor,
                coef: torch.Tensor, eps: float, vocab_size: int, softcap: float | None, chunk_size: int | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh (N, D), dweight (Vl, D)) in the compute dtype, recomputing each block from lse (N,): the backward when
    the forward could not compute them (reduction "none", a vocab-parallel shard, no gradient wanted then)."""
    dh = torch.empty_like(h)
    dw = torch.zeros_like(w)
    idx = torch.where(here, local_t, torch.zeros_like(local_t)).unsqueeze(1)          # (N, 1)
    kernel = block_kernel(h)
    cols = torch.where(here, local_t, torch.full_like(local_t, -1))                    # (N,) -1: not here
    step = _step(chunk_size, w)
    blocks = _Blocks(h, w, step, None if kernel else softcap)
    for i in range(0, h.shape[0], step):
        hc = h[i:i + step]
        z, th = blocks.logits(hc)
        j = i + z.shape[0]
        if kernel:                                       # the block's gradient in place
            kernel(z, cols[i:j], coef[i:j], lse[i:j], eps, vocab_size, softcap)
            _matmuls(z, w, hc, dh[i:j], dw)
            continue
        g = z.sub_(lse[i:j].unsqueeze(1)).exp_().mul_(coef[i:j].unsqueeze(1))         # coef * softmax (c, Vl)
        _grad_block(g, th, idx[i:j], here[i:j], coef[i:j], eps, vocab_size, w, hc, dh[i:j], dw)
    return dh, dw


def token_weights(grad: torch.Tensor, valid: torch.Tensor, reduction: str, dtype: torch.dtype) -> torch.Tensor:
    """Each token's gradient weight (N,): grad (() or (N,)), / count for "mean" (count >= 1, on the device),
    0 where ignored."""
    g = grad.reshape(-1).to(dtype) if reduction == "none" else grad.to(dtype).expand(valid.shape[0])
    if reduction == "mean":
        g = g / valid.sum().clamp_min(1).to(dtype)
    return torch.where(valid, g, torch.zeros_like(g))


def reduce_loss(per: torch.Tensor, valid: torch.Tensor, reduction: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Per-token losses (N,) (0 where ignored) -> the reduction: () or ``shape``."""
    if reduction == "none":
        return per.reshape(shape)
    if reduction == "sum":
        return per.sum()
    return per.sum() / valid.sum().clamp_min(1).to(per.dtype)


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
    must make); a second backward through the same graph (``retain_graph``) recomputes them from lse, as the
    NumPy twin does (the same gradients to rounding, so ``gradcheck`` needs a ``nondet_tol`` of about 1e-12 for
    "mean" and "sum"). First order only (:func:`first_order`: a second derivative raises)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                eps: float, reduction: str, softcap: float | None, chunk_size: int | None,
                with_grad: bool) -> torch.Tensor:
        loss, lse, dh, dw = forward_impl(h, weight, targets, ignore_index, eps, reduction, softcap, chunk_size,
                                         with_grad)
        ctx.grads = [(dh, dw)] if with_grad else []          # intermediates, handed over once (not saved tensors)
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.options = (ignore_index, eps, reduction, softcap, chunk_size)
        return loss

    @staticmethod
    @first_order
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        h, weight, targets, lse = ctx.saved_tensors          # the version check: weight not changed in place since
        if ctx.grads:
            dh, dw = ctx.grads.pop()
            dh, dw = dh.mul_(grad), dw.mul_(grad)            # grad as it is: a loss scale may not fit h's dtype
        else:
            dh, dw = backward_impl(grad, h, weight, targets, lse, *ctx.options)
        return (dh if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
                None, None, None, None, None, None, None)
