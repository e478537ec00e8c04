"""The counter-hash dropout multiplier as one Triton helper, shared by the forward and backward kernels.

It is :mod:`tokenpos.tables.formulas.dropout` restated on uint64 lanes (wrapping arithmetic, logical shifts):

    key  = splitmix64((seed & (2**63 - 1)) + GOLDEN)          (per call, from the 0-d seed tensor)
    c    = flat_index = offset + n * D + d
    z    = splitmix64(key ^ ((c >> 1) * GOLDEN))               (one hash per pair of counters)
    keep = ((z >> (32 * (c & 1) + 8)) & 0xFFFFFF) >= ceil(p * 2**24)
    m    = 1 / (1 - p) if keep else 0.0                        (fp32; the caller multiplies: x * m)

The seed is read from device memory (a 0-d int64 tensor), so a launch never syncs with the host and a
CUDA graph can replay it with a new seed written into the same tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tokenpos.tables.checks.validation import check_float
from tokenpos.tables.formulas.dropout import dropout_threshold

GOLDEN = 0x9E3779B97F4A7C15
SEED_MASK = (1 << 63) - 1


@triton.jit
def splitmix64(z):
    """The splitmix64 finaliser on a uint64 tensor (wrapping multiplies, logical shifts)."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def dropout_key(seed_ptr):
    """The per-call uint64 key from the 0-d int64 seed tensor (once per program)."""
    seed = tl.load(seed_ptr).to(tl.uint64) & 0x7FFFFFFFFFFFFFFF
    return splitmix64(seed + 0x9E3779B97F4A7C15)


@triton.jit
def dropout_multiplier(key, flat_index, threshold, inv_keep):
    """fp32 multiplier m (same shape as ``flat_index``, any integer dtype): ``inv_keep`` if kept else 0."""
    c = flat_index.to(tl.uint64)
    z = splitmix64(key ^ ((c >> 1) * 0x9E3779B97F4A7C15))
    keep = ((z >> (((c & 1) << 5) + 8)) & 0xFFFFFF) >= threshold
    return tl.where(keep, inv_keep, 0.0).to(tl.float32)


@triton.jit
def dropout_multiplier_tile(key, flat_index, threshold, inv_keep, ROWS: tl.constexpr, COLS: tl.constexpr,
                            PAIRS: tl.constexpr):
    """:func:`dropout_multiplier` of a (ROWS, COLS) tile of counters. With ``PAIRS`` (every row's first
    counter even, COLS even) one hash serves each pair of neighbouring counters, as the formula allows
    (counter 2j takes the low word of hash j, 2j + 1 the high word): half the 64-bit multiplies."""
    if PAIRS:
        even, _ = tl.split(tl.reshape(flat_index.to(tl.uint64), (ROWS, COLS // 2, 2)))   # (ROWS, COLS/2)
        z = splitmix64(key ^ ((even >> 1) * 0x9E3779B97F4A7C15))
        m_even = tl.where(((z >> 8) & 0xFFFFFF) >= threshold, inv_keep, 0.0).to(tl.float32)
        m_odd = tl.where((z >> 40) >= threshold, inv_keep, 0.0).to(tl.float32)
        return tl.reshape(tl.join(m_even, m_odd), (ROWS, COLS))
    else:
        return dropout_multiplier(key, flat_index, threshold, inv_keep)


def dropout_args(p: float) -> tuple[int, float]:
    """Host side: (threshold on the 24-bit grid, 1/(1-p) as a Python float, 0.0 when p == 1)."""
    p = check_float("dropout p", p, low=0.0, high=1.0)                         # ConfigError otherwise
    return dropout_threshold(p), (1.0 / (1.0 - p) if p < 1.0 else 0.0)


def seed_tensor(seed: Any, device: torch.device) -> torch.Tensor:
    """A 0-d int64 tensor on ``device``: the seed tensor itself when it already is one (no copy, no sync)."""
    if isinstance(seed, torch.Tensor):
        if seed.numel() != 1 or seed.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"seed must be a 0-d int64 tensor or an int, got {seed.dtype} of shape "
                            f"{tuple(seed.shape)}")
        return seed.reshape(()).to(device=device, dtype=torch.int64)
    return torch.tensor(int(seed) & SEED_MASK, dtype=torch.int64, device=device)
