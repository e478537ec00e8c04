"""The counter-based dropout hash of :mod:`tokenpos.tables.dropout`, compiled by numba.

Bit-identical to the NumPy formula (the tests compare every bit):

    z    = splitmix64(seed_key ^ (offset + i) * GOLDEN)     (uint64 arithmetic, wrapping)
    keep = (z >> 40) >= ceil(p * 2**24)

``seed_key`` and the threshold are computed once per call in Python (by the tables functions); the
kernels only evaluate :func:`keep_bits` per element. Every operand is uint64: numba would promote a
uint64/int64 mix to float64 and silently lose bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tokenpos.tables.dropout import GOLDEN, MIX1, MIX2, dropout_threshold, seed_key

_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S40 = np.uint64(40)


@njit(inline="always", cache=True)
def keep_bits(key, idx):  # pragma: no cover - compiled
    """The 24 high bits of the hash of flat element counter ``idx`` (both uint64)."""
    z = key ^ (idx * GOLDEN)
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    z = z ^ (z >> _S31)
    return z >> _S40


@njit(inline="always", cache=True)
def keep_bits_mul(key, idx_golden):  # pragma: no cover - compiled
    """:func:`keep_bits` given ``idx * GOLDEN`` (wrapping) already: a loop over consecutive counters
    can carry that product by adding GOLDEN, which saves one 64-bit multiply per element."""
    z = key ^ idx_golden
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    z = z ^ (z >> _S31)
    return z >> _S40


@njit(parallel=False, cache=True)
def _keep_mask_core(key, thr, offset, n, out):  # pragma: no cover - compiled
    for i in range(n):
        out[i] = keep_bits(key, offset + np.uint64(i)) >= thr


def dropout_params(seed: int, p: float) -> tuple[np.uint64, np.uint64, float]:
    """``(key, threshold, inverse_keep)`` for a dropout call; inverse_keep is ``1 / (1 - p)``."""
    key = np.uint64(seed_key(seed))
    thr = np.uint64(dropout_threshold(p))
    return key, thr, 1.0 / (1.0 - p)


def keep_mask(seed: int, n: int, p: float, offset: int = 0) -> np.ndarray:
    """Flat boolean keep mask of ``n`` elements from the compiled hash (the tests' bridge)."""
    key, thr, _ = dropout_params(seed, p)
    out = np.empty(n, dtype=np.bool_)
    _keep_mask_core(key, thr, np.uint64(offset), n, out)
    return out
