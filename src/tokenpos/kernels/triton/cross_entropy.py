"""Vocab-parallel cross-entropy: one pass over a shard of the logits, a tiny combine, a fused backward.

Shapes: N rows (tokens), Vs = the shard's columns (a contiguous vocab range [vocab_start, vocab_start + Vs)
of a padded vocab, see :mod:`tokenpos.tables.formulas.vocab_parallel`), W shards (tensor-parallel ranks).

Forward per shard, one program per row, online softmax over column blocks, fp32 whatever the logits dtype:

    stats[n] = (m, s, t):  m = max_v x[n, v],  s = sum_v exp(x[n, v] - m),
                           t = x[n, target[n] - vocab_start] if the target lies in this shard else 0

Combine (W stats gathered from the ranks, e.g. with one ``all_gather`` instead of Megatron's three
all-reduces): M = max_r m_r, lse = M + log(sum_r s_r * exp(m_r - M)), loss = lse - sum_r t_r (0 for rows
whose target is ``ignore_index``). Backward per shard, elementwise:
grad[n, v] = (exp(x[n, v] - lse[n]) - [v == target[n] - vocab_start]) * grad_loss[n], optionally
written over the logits (``inplace=True``) to save the (N, Vs) buffer.

exp/log are Triton's (approximate on a GPU), so results match torch to float tolerance, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS, round_to
from tokenpos.kernels.triton._grid import cdiv, next_power_of_2
from tokenpos.tables.errors import ConfigError

BLOCK_V = 1024


@triton.jit
def _stats_kernel(x_ptr, tgt_ptr, out_ptr, Vs, stride_x, vocab_start, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    row = x_ptr + n * stride_x
    m = tl.full((BLOCK,), float("-inf"), tl.float32)                          # per-lane running max
    s = tl.zeros((BLOCK,), tl.float32)                                        # per-lane sum of exp(x - m)
    for v0 in range(0, Vs, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        x = tl.load(row + cols, mask=cols < Vs, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, x)
        safe = tl.where(new_m == float("-inf"), 0.0, new_m)                    # lanes that saw only -inf
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = new_m
    row_m = tl.max(m, axis=0)
    safe_m = tl.where(row_m == float("-inf"), 0.0, row_m)
    row_s = tl.sum(s * tl.exp(m - safe_m), axis=0)                             # lanes at -inf add 0
    t = tl.load(tgt_ptr + n).to(tl.int64) - vocab_start
    inside = (t >= 0) & (t < Vs)
    tx = tl.load(row + tl.where(inside, t, 0), mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + n * 3, row_m)
    tl.store(out_ptr + n * 3 + 1, row_s)
    tl.store(out_ptr + n * 3 + 2, tl.where(inside, tx, 0.0))


@triton.jit
def _backward_kernel(x_ptr, tgt_ptr, lse_ptr, g_ptr, out_ptr, Vs, stride_x, stride_o, vocab_start, ignore_index,
                     BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = cols < Vs
    x = tl.load(x_ptr + n * stride_x + cols, mask=cm, other=0.0).to(tl.float32)
    tgt = tl.load(tgt_ptr + n).to(tl.int64)
    lse = tl.load(lse_ptr + n)
    g = tl.load(g_ptr + n).to(tl.float32)
    g = tl.where(tgt == ignore_index, 0.0, g)
    p = tl.exp(x - lse)
    grad = (p - tl.where(cols == tgt - vocab_start, 1.0, 0.0)) * g
    tl.store(out_ptr + n * stride_o + cols, round_to(grad, out_ptr.dtype.element_ty), mask=cm)


def _check(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ConfigError(f"logits must be a float32/float16/bfloat16 tensor of shape (N, Vs), got {logits.dtype} "
                          f"{tuple(logits.shape)}")
    if targets.shape != logits.shape[:1]:
        raise ConfigError(f"targets must have shape ({logits.shape[0]},), got {tuple(targets.shape)}")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def cross_entropy_stats(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0) -> torch.Tensor:
    """This shard's (N, 3) float32 stats (max, sum of exp(x - max), target logit or 0); logits (N, Vs)."""
    logits = _check(logits, targets)
    N, Vs = logits.shape
    out = torch.empty((N, 3), dtype=torch.float32, device=logits.device)
    if N:
        block = min(next_power_of_2(max(Vs, 1)), BLOCK_V)
        _stats_kernel[(N,)](logits, targets.contiguous(), out, Vs, logits.stride(0), int(vocab_start),
                            BLOCK=block, **LAUNCH_OPTIONS)
    return out


def combine_cross_entropy_stats(stats: torch.Tensor, targets: torch.Tensor,
                                ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, N, 3) stats of all shards -> (loss (N,), lse (N,)) in float32; ignored rows get loss 0."""
    m, s, t = stats.unbind(-1)                                                 # each (W, N)
    M = m.max(dim=0).values                                                    # (N,)
    lse = M + torch.log((s * torch.exp(m - M)).sum(dim=0))
    loss = torch.where(targets == ignore_index, 0.0, lse - t.sum(dim=0))
    return loss, lse


def cross_entropy_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor,
                           vocab_start: int = 0, ignore_index: int = -100, *, inplace: bool = False) -> torch.Tensor:
    """d loss / d logits for this shard, (N, Vs) in the logits' dtype; ``inplace`` writes it over the logits."""
    logits = _check(logits, targets)
    N, Vs = logits.shape
    out = logits if inplace else torch.empty_like(logits)
    if N and Vs:
        block = min(next_power_of_2(max(Vs, 1)), BLOCK_V)
        _backward_kernel[(N, cdiv(Vs, block))](
            logits, targets.contiguous(), lse.float().contiguous(), grad_loss.contiguous(), out, Vs,
            logits.stride(0), out.stride(0), int(vocab_start), int(ignore_index), BLOCK=block, **LAUNCH_OPTIONS)
    return out


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                  ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsharded convenience: (loss (N,), lse (N,)) for logits (N, V) in one stats pass."""
    return combine_cross_entropy_stats(cross_entropy_stats(logits, targets)[None], targets, ignore_index)
