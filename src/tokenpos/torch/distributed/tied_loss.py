"""The vocab-parallel tied loss: ``VocabParallelEmbedding.loss(h, targets)`` without any rank holding logits
of more than one (c, Vl) block, and without gathering them.

Shapes: h (..., D) flattened to (N, D), the same on every rank; this rank's rows weight (Vl, D), of which
the first ``n_real`` are real tokens (the rest padding, never a class); V the real vocab; c tokens per block.

Per token, each rank reduces its own columns block by block (``ops.tied_loss_blocks.local_pass``: max m_r,
sum exp(z - m_r), the target's logit where it owns the target, the sum of its logits with label
smoothing), then, as ``vocab_parallel_cross_entropy`` does, three all-reduces of (N,)-sized vectors:

    m   = max_r m_r                                   all-reduce 1 (max)
    s   = sum_r s_r * exp(m_r - m)                    all-reduce 2 (sum)
    z_t, sum_v z_v                                    all-reduce 3 (sum, one stacked call)
    lse = log s + m;  loss_n = (1 - eps)(lse - z_t) + eps (lse - sum_v z_v / V)

Backward recomputes this rank's blocks from lse (``ops.tied_loss_blocks.local_grads``): this rank's rows of
dweight, and its part of dh, which ``copy_to_group`` all-reduces (one all-reduce, as ``attend``'s).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tokenpos.torch.distributed._comm import all_reduce
from tokenpos.torch.ops.first_order import first_order
from tokenpos.torch.ops.tied_loss_blocks import compute_dtype, local_grads, local_pass, reduce_loss, token_weights


class VocabParallelTiedLoss(torch.autograd.Function):
    """h (..., D), this rank's weight (Vl, D), targets (...) -> loss () or (...) in the compute dtype."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, group: Any, world: int,
                start: int, n_real: int, vocab_size: int, ignore_index: int, eps: float, reduction: str,
                softcap: float | None, chunk_size: int | None) -> torch.Tensor:
        c = compute_dtype(h.dtype)
        h2 = h.reshape(-1, h.shape[-1]).to(c)                                  # (N, D)
        w = weight[:n_real].to(c)                                              # (n_real, D)
        t = targets.reshape(-1).to(h.device).long()                            # (N,)
        valid = t != ignore_index
        local_t = t - start
        here = valid & (local_t >= 0) & (local_t < n_real)
        N = t.shape[0]
        if n_real > 0:
            m_r, s_r, zt, zsum, _, _ = local_pass(h2, w, local_t, here, eps, vocab_size, softcap, chunk_size)
        else:                                                                  # a rank of padding rows only
            m_r = torch.full((N,), float("-inf"), dtype=c, device=h.device)
            s_r, zt = torch.zeros_like(m_r), torch.zeros_like(m_r)
            zsum = torch.zeros_like(m_r) if eps > 0.0 else None
        m = m_r.clone()
        if world > 1:
            all_reduce(m, group, dist.ReduceOp.MAX)
        s = s_r * torch.exp(m_r - m)
        if world > 1:
            all_reduce(s, group)
        parts = torch.stack([zt] if zsum is None else [zt, zsum])              # (1 or 2, N)
        if world > 1:
            all_reduce(parts, group)
        lse = s.log_().add_(m)
        per = lse - parts[0]
        if eps > 0.0:
            per = (1.0 - eps) * per + eps * (lse - parts[1] / vocab_size)
        per = torch.where(valid, per, torch.zeros_like(per))
        ctx.save_for_backward(h, weight, lse, local_t, here, valid)
        ctx.args = (n_real, vocab_size, eps, reduction, softcap, chunk_size)
        return reduce_loss(per, valid, reduction, tuple(targets.shape))

    @staticmethod
    @first_order                       # a second derivative raises (its blocks are written with out=)
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        h, weight, lse, local_t, here, valid = ctx.saved_tensors
        n_real, vocab_size, eps, reduction, softcap, chunk_size = ctx.args
        c = lse.dtype
        h2 = h.reshape(-1, h.shape[-1]).to(c)
        dweight = torch.zeros_like(weight)
        if n_real > 0:
            coef = token_weights(grad, valid, reduction, c)
            dh, dw = local_grads(h2, weight[:n_real].to(c), lse, local_t, here, coef, eps, vocab_size, softcap,
                                 chunk_size)
            dweight[:n_real] = dw
        else:
            dh = torch.zeros_like(h2)
        return (dh.reshape(h.shape).to(h.dtype), dweight, None, None, None, None, None, None, None, None, None, None,
                None)
