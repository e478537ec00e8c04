"""The chunked computation of the tied loss, shared by its ops (:mod:`.tied_loss`) and the vocab-parallel loss
(``tokenpos.torch.distributed.tied_loss``): blocks of (c, Vl) logits of h (N, D) against w (Vl, D), each a matmul,
then its soft-cap, log-sum-exp and gradient in place (on CUDA the Triton block kernel, elsewhere plain torch ops).

Shapes: N tokens, D hidden, Vl <= V the columns of this call, c = chunk_size tokens per block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenpos.tables.formulas.tied_loss import default_chunk_size
from tokenpos.torch._checks import transforms_active
from tokenpos.torch.ops._dispatch import triton_kernels


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


