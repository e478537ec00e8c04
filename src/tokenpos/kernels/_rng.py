"""The counter-based dropout hash of :mod:`tokenpos.tables.formulas.dropout`, compiled by numba.

Bit-identical to the NumPy formula (the tests compare every bit):

    c    = offset + i
    z    = splitmix64(seed_key ^ (c >> 1) * GOLDEN)         (uint64 arithmetic, wrapping)
    keep = ((z >> (32 * (c & 1) + 8)) & 0xFFFFFF) >= ceil(p * 2**24)

The threshold is computed once per call in Python (by the tables function); each core derives the
key from the seed once (:func:`key_of`) and evaluates :func:`keep_bits` per element (row tails), or
one hash per pair of elements (:func:`multiplier_row`; the vector lines of :mod:`._lines`). Every operand
is uint64: numba would promote a uint64/int64 mix to float64 and silently lose bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tokenpos.tables.formulas.dropout import GOLDEN, MIX1, MIX2, SEED_MASK, dropout_threshold

_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S1 = np.uint64(1)
_S8 = np.uint64(8)
_S5 = np.uint64(5)
_M24 = np.uint64(0xFFFFFF)
_S40 = np.uint64(40)


@njit(inline="always", cache=True)
def mix64(z):  # pragma: no cover - compiled
    """The splitmix64 finalizer of a uint64 (wrapping): the one compiled spelling of the hash."""
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    return z ^ (z >> _S31)


@njit(inline="always", cache=True)
def key_of(seed):  # pragma: no cover - compiled
    """The per-call key of a masked uint64 seed: :func:`tokenpos.tables.formulas.dropout.seed_key`, compiled."""
    return mix64(seed + GOLDEN)


@njit(inline="always", cache=True)
def keep_bits(key, idx):  # pragma: no cover - compiled
    """The 24 hash bits of counter ``idx`` (both uint64): a word of the hash of the pair ``idx >> 1``."""
    return (mix64(key ^ ((idx >> _S1) * GOLDEN)) >> (((idx & _S1) << _S5) + _S8)) & _M24


@njit(inline="always", cache=True)
def multiplier_row(key, thr, inv, c0, m):  # pragma: no cover - compiled
    """m[d] = inv if counter ``c0 + d`` keeps else 0 (``m`` 1-D float): one hash per pair of counters."""
    n = m.shape[0]
    zero = inv - inv
    d = 0
    if n and c0 & _S1:                                  # an odd first counter: the high word of its pair
        m[0] = inv if keep_bits(key, c0) >= thr else zero
        d = 1
    jg = ((c0 + np.uint64(d)) >> _S1) * GOLDEN          # the pair's index * GOLDEN, carried by addition
    while d + 1 < n:
        z = mix64(key ^ jg)
        m[d] = inv if ((z >> _S8) & _M24) >= thr else zero
        m[d + 1] = inv if (z >> _S40) >= thr else zero
        jg += GOLDEN
        d += 2
    if d < n:
        m[d] = inv if keep_bits(key, c0 + np.uint64(d)) >= thr else zero


@njit(parallel=False, cache=True)
def _keep_mask_core(seed, thr, offset, n, out):  # pragma: no cover - compiled
    key = key_of(seed)
    for i in range(n):
        out[i] = keep_bits(key, offset + np.uint64(i)) >= thr


def dropout_params(seed: int, p: float) -> tuple[np.uint64, np.uint64, float]:
    """``(seed bits, threshold, inverse_keep)`` for a dropout call; inverse_keep is ``1 / (1 - p)``.

    The cores derive the key from the seed bits themselves (:func:`key_of`): computed here with
    NumPy's error state it cost ~45 us per call with cold caches, inside the core nothing.
    """
    return np.uint64(int(seed) & SEED_MASK), np.uint64(dropout_threshold(p)), 1.0 / (1.0 - p)


def keep_mask(seed: int, n: int, p: float, offset: int = 0) -> np.ndarray:
    """Flat boolean keep mask of ``n`` elements from the compiled hash (the tests' bridge)."""
    bits, thr, _ = dropout_params(seed, p)
    out = np.empty(n, dtype=np.bool_)
    _keep_mask_core(bits, thr, np.uint64(offset), n, out)
    return out
