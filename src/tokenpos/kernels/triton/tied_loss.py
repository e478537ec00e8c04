"""The tied cross-entropy's work on one block of logits, in place, on CUDA (Liger-Kernel's design: the caller's
cuBLAS matmul makes a (c, Vl) block of logits, this kernel turns it into the block's statistics and gradient).

z (c, Vl) float32 logits ``h_block @ weight.T``, C-contiguous, overwritten; t (c,) int64 target columns (-1:
none here: ignored, or another shard's); coef (c,) each token's gradient weight (0 for an ignored token); lse
(c,) a given log-sum-exp. Per row n (formulas: :mod:`tokenpos.tables.formulas.tied_loss`), eps = label
smoothing, V the full vocab (Vl <= V: a vocab shard, or all V):

    z <- softcap * tanh(z / softcap)                                  (when softcap is given)
    stats[n] = (m, s, z_t, sum_v z_v):  m = max_v z_v,  s = sum_v exp(z_v - m),  z_t = z[n, t_n] (t_n >= 0, else 0)
    g[n, v]  = coef_n * (exp(z_v - lse_n) - (1 - eps) [v == t_n] - eps / V) * (1 - tanh^2)   written over z

MODE 0 (no ``coef``): the stats only (z left soft-capped); 1 (``coef``, no ``lse``): the stats, then
lse = m + log s, then the gradient; 2 (``coef`` and ``lse``): the gradient from that lse (the backward, or a
vocab-parallel shard). Its NumPy twin, the tests' oracle: :func:`tokenpos.kernels.reference.tied_loss_block_ref`.

One program per row, column blocks of ``BLOCK`` in order: an online log-sum-exp (per-lane running max and
sum, combined across lanes at the end), then the gradient pass. No atomics and a fixed reduction order, so
on one GPU the same inputs give the same bits run to run; Triton's ``exp`` and ``log`` are the GPU's fast
approximations and its lane-combining ``tl.max`` / ``tl.sum`` tree depends on BLOCK and the compiler, so
the results match the plain torch path (the CPU's) to float tolerance, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS
from tokenpos.kernels.triton._grid import next_power_of_2
from tokenpos.tables.errors import ConfigError

BLOCK_V = 1024


@triton.jit
def _tanh(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1): exact at +-inf (exp overflows to inf, or gives 0)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _tied_loss_block_kernel(z_ptr, t_ptr, coef_ptr, lse_ptr, stats_ptr, Vl, stride_z, eps, vocab_size, softcap,
                            MODE: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    row = z_ptr + n * stride_z
    tn = tl.load(t_ptr + n)
    zt = tl.load(row + tl.where(tn >= 0, tn, 0), mask=tn >= 0, other=0.0)
    if CAP:
        zt = softcap * _tanh(zt / softcap)             # in registers: the same bits the pass below writes
        for v0 in range(0, Vl, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < Vl, other=0.0)
            tl.store(row + cols, softcap * _tanh(x / softcap), mask=cols < Vl)
        # The passes below read the row back, and a lane may read a column another lane (another warp)
        # wrote: a barrier makes the block's writes visible first. Without it, on an H100, z_t read back
        # as the uncapped logit in some runs (tests/kernels/triton/test_triton_tied_loss.py).
        tl.debug_barrier()
    if MODE != 2:
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        zs = tl.zeros((BLOCK,), tl.float32)
        for v0 in range(0, Vl, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < Vl, other=float("-inf"))
            zs += tl.where(cols < Vl, x, 0.0)
            new_m = tl.maximum(m, x)
            safe = tl.where(new_m == float("-inf"), 0.0, new_m)
            s = s * tl.exp(m - safe) + tl.exp(x - safe)
            m = new_m
        row_m = tl.max(m, axis=0)
        safe_m = tl.where(row_m == float("-inf"), 0.0, row_m)
        row_s = tl.sum(s * tl.exp(m - safe_m), axis=0)
        tl.store(stats_ptr + n * 4, row_m)
        tl.store(stats_ptr + n * 4 + 1, row_s)
        tl.store(stats_ptr + n * 4 + 2, zt)
        tl.store(stats_ptr + n * 4 + 3, tl.sum(zs, axis=0))
        ln = row_m + tl.log(row_s)
    else:
        ln = tl.load(lse_ptr + n)
    if MODE != 0:
        k = tl.load(coef_ptr + n)
        off = k * (eps / vocab_size)
        for v0 in range(0, Vl, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < Vl, other=0.0)
            g = k * tl.exp(x - ln) - off - tl.where(cols == tn, k * (1.0 - eps), 0.0)
            if CAP:
                th = x / softcap
                g = g * (1.0 - th * th)
            tl.store(row + cols, g, mask=cols < Vl)


def tied_loss_block(z: torch.Tensor, t: torch.Tensor, *, coef: torch.Tensor | None = None,
                    lse: torch.Tensor | None = None, eps: float = 0.0, vocab_size: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """z (c, Vl) float32 overwritten, t (c,) int64 -> stats (c, 4) float32, or (0, 4) with ``lse`` (module doc).

    Raises:
        ConfigError: tensors of other shapes, dtypes or devices.
    """
    if z.dim() != 2 or z.dtype != torch.float32 or not z.is_contiguous():
        raise ConfigError(f"z must be a contiguous float32 tensor of shape (c, Vl), got {z.dtype} {tuple(z.shape)}")
    c, Vl = z.shape
    for name, a, dt in (("t", t, torch.int64), ("coef", coef, torch.float32), ("lse", lse, torch.float32)):
        if a is not None and (tuple(a.shape) != (c,) or a.dtype != dt or a.device != z.device):
            raise ConfigError(f"{name} must be a {dt} tensor of shape ({c},) on {z.device}, got {a.dtype} "
                              f"{tuple(a.shape)} on {a.device}")
    if lse is not None and coef is None:
        raise ConfigError("lse is only used with coef (the gradient from a given lse)")
    mode = 0 if coef is None else (1 if lse is None else 2)
    stats = torch.empty((0 if mode == 2 else c, 4), dtype=torch.float32, device=z.device)
    if c and Vl:
        dummy = stats.new_empty((1,))
        _tied_loss_block_kernel[(c,)](
            z, t.contiguous(), dummy if coef is None else coef.contiguous(), dummy if lse is None else lse.contiguous(),
            stats if mode != 2 else dummy, Vl, z.stride(0), float(eps), float(Vl if vocab_size is None else vocab_size),
            float(softcap or 1.0), MODE=mode, CAP=softcap is not None, BLOCK=min(next_power_of_2(Vl), BLOCK_V),
            **LAUNCH_OPTIONS)
    return stats
