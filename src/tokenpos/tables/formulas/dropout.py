"""Counter-based dropout: the keep mask is a pure function of (seed, flat element index).

This makes dropout reproducible from a seed, lets backward recompute the mask instead of storing
it, and lets a parallel kernel compute any element independently. The NumPy reference below and
the numba kernels share this exact formula.

    c    = offset + i                                       (the element's counter)
    z    = splitmix64(seed_key ^ (c >> 1) * GOLDEN)         (uint64 arithmetic, wrapping)
    u_i  = ((z >> (32 * (c & 1) + 8)) & 0xFFFFFF) / 2**24   (uniform on [0, 1), 24 bits)
    keep = u_i >= p

One hash serves two neighbouring counters: counter ``2j`` takes the top 24 bits of the low 32-bit
word of hash ``j``, counter ``2j + 1`` those of the high word. splitmix64's output bits are
independent to the tests of BigCrush, so the two halves are two independent uniforms; sharing
halves the hash's cost (two 64-bit multiplies per two elements), which was most of the fused
forward's arithmetic (measured: benchmarks/HISTORY.md).

Dropout itself is a multiply, everywhere (NumPy, torch, the numba kernels):

    out = x * m,    m = 1 / (1 - p) if keep else 0

never ``where(keep, x / (1 - p), 0)``: a NaN or Inf in ``x`` stays NaN in dropped elements too,
as in ``torch.nn.Dropout``, so a diverging run is visible. The backward is ``grad * m``. For
float16/bfloat16 inputs, ``m`` and the product are float32, rounded once to the input dtype.
"""

from __future__ import annotations

import math

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
SEED_MASK = (1 << 63) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def seed_key(seed: int) -> np.uint64:
    """The per-call key derived from a user seed (a 63-bit non-negative int)."""
    with np.errstate(over="ignore"):
        return _mix(np.asarray([np.uint64(int(seed) & SEED_MASK)], dtype=np.uint64) + GOLDEN)[0]


def dropout_threshold(p: float) -> int:
    """Integer threshold t such that keep iff the element's 24 hash bits are >= t, i.e. u >= p on the
    24-bit grid."""
    return math.ceil(p * (1 << 24))                 # exact: p * 2**24 only shifts the exponent


def keep_bits(seed: int, offset: int, n: int) -> np.ndarray:
    """(n,) uint64: the 24 hash bits of counters ``offset .. offset + n - 1`` (the formula above)."""
    first, last = offset >> 1, (offset + n + 1) >> 1          # the hashes (counter pairs) covering them
    j = np.arange(first, last, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = _mix(seed_key(seed) ^ (j * GOLDEN))
    words = np.stack([z & np.uint64(0xFFFFFFFF), z >> np.uint64(32)], axis=-1).reshape(-1)   # counter order
    return words[offset & 1: (offset & 1) + n] >> np.uint64(8)


def dropout_keep_mask(seed: int, shape: tuple[int, ...], p: float, offset: int = 0) -> np.ndarray:
    """Boolean keep mask of ``shape``; element with C-order flat index i uses counter offset + i."""
    n = int(np.prod(shape, dtype=np.int64))
    return (keep_bits(seed, offset, n) >= np.uint64(dropout_threshold(p))).reshape(shape)


def draw_seed(rng: np.random.Generator) -> int:
    """A fresh 63-bit dropout seed from an explicit generator."""
    return int(rng.integers(0, SEED_MASK, dtype=np.int64))


def dropout_multiplier(seed: int, shape: tuple[int, ...], p: float, offset: int = 0,
                       dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``m`` of ``shape``: ``1 / (1 - p)`` where kept, ``0`` where dropped (``dtype``, float32 or wider)."""
    keep = dropout_keep_mask(seed, shape, p, offset)
    dt = np.dtype(dtype)
    return keep * dt.type(1.0 / (1.0 - p))


def apply_dropout(x: np.ndarray, seed: int, p: float, offset: int = 0) -> np.ndarray:
    """``x * m`` (see the module docstring); float16 inputs are computed in float32, rounded once.

    Shapes: ``x`` any shape (...); element with C-order flat index i uses counter ``offset + i``.
    """
    x = np.asarray(x)
    if p == 0.0:
        return x.copy()
    wide = np.promote_types(x.dtype, np.float32)
    with np.errstate(invalid="ignore"):                   # NaN/Inf * 0 -> NaN, as torch
        return (x.astype(wide, copy=False) * dropout_multiplier(seed, x.shape, p, offset, wide)).astype(x.dtype)
