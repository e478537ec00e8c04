"""The one place where the NumPy backend chooses between a fused numba kernel and plain NumPy.

A kernel runs when ``tokenpos.kernels_enabled()`` and every float array of the call is float32 or
float64 of one dtype. Everything else (float16, mixed dtypes, kernels off) takes the plain path,
which gives the same result up to float rounding (identical dropout masks).
"""

from __future__ import annotations

import numpy as np

from tokenpos._config import kernels_enabled

KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def use_kernel(*arrays: np.ndarray) -> bool:
    """Whether the fused kernel handles these float arrays (kernels on, one float32/float64 dtype).

    A loop, not ``all(...)`` over a generator: a call of every layer passes here, and a generator is one
    more frame per call."""
    if not kernels_enabled():
        return False
    dt = arrays[0].dtype
    if dt not in KERNEL_DTYPES:
        return False
    for a in arrays:
        if a.dtype != dt:
            return False
    return True


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for float16 inputs (rounded once at the end), else the input's."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def kept(arr: np.ndarray) -> np.ndarray:
    """A private copy of an input that a cache keeps for backward.

    The one rule for inputs kept for backward: copy them. Refilling the caller's batch buffer
    between forward and backward then cannot redirect the gradient.
    """
    return np.array(arr, copy=True)
