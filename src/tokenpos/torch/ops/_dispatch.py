"""Which implementation an op runs: the ONE place that chooses between the numba kernel, a Triton
kernel and plain torch.

- CPU float32 / float64 / bfloat16 with ``tokenpos.kernels_enabled()``: the numba kernel on
  zero-copy NumPy views (:func:`np_view`; bf16 as its 16-bit patterns), writing into a fresh
  output from :func:`cpu_empty` (``out=``). RoPE has no bf16 kernel ("numba" paths only).
- CUDA float32 / bf16 / fp16: ``tokenpos.kernels.triton`` when it imports (Triton present), else
  plain torch (float64 on CUDA too).
- everything else (fp16, meta, MPS, mixed dtypes, kernels switched off): plain torch.

The choice is made inside the op's implementation, at run time, on real (unwrapped) tensors, so a
``torch.compile`` graph keeps the op and still follows ``tokenpos.set_kernels``.
Every path receives checked inputs: the op's implementation checks shapes, dtypes and scalars first
(``tables.checks.ops``), the layers the values of ids and positions at their public entry.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import torch

from tokenpos._config import OUTPUTS, kernels_enabled

_NUMBA = {torch.float32: "numba", torch.float64: "numba", torch.bfloat16: "numba_bf16"}


def cpu_path(x: torch.Tensor, y: torch.Tensor | None = None) -> str:
    """"numba", "numba_bf16" or "plain" for CPU tensors x (and y, which must share x's dtype)."""
    if not kernels_enabled() or (y is not None and y.dtype != x.dtype):
        return "plain"
    return _NUMBA.get(x.dtype, "plain")


_TRITON: list[Any] = []                   # [module or None], filled on the first CUDA call


TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # the Triton kernels refuse float64


def triton_kernels(*tensors: torch.Tensor) -> Any:
    """``tokenpos.kernels.triton`` for these CUDA tensors when it imports (Triton installed, kernels on)
    and every tensor has a dtype the Triton kernels take; else None (the caller runs plain torch)."""
    if not kernels_enabled() or any(t.dtype not in TRITON_DTYPES for t in tensors):
        return None
    if not _TRITON:
        try:
            _TRITON.append(importlib.import_module("tokenpos.kernels.triton"))
        except ImportError:
            _TRITON.append(None)
    return _TRITON[0]


_NP_DTYPES: dict[torch.dtype, np.dtype[Any]] = {torch.float32: np.dtype(np.float32),
                                               torch.float64: np.dtype(np.float64),
                                               torch.bfloat16: np.dtype(np.uint16)}


def cpu_empty(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """A fresh, uninitialised CPU tensor for a kernel's output, and the NumPy array over its memory
    (bf16: the 16-bit patterns), so the kernel writes into the tensor without another conversion.

    A large output's memory comes from :data:`tokenpos._config.OUTPUTS`, a released block (no page faults;
    its storage cannot be resized in place, as for any tensor whose memory NumPy also sees), never from a
    large ``torch.empty``, which faults on every call; under the cache's ``min_bytes`` or with the cache off,
    ``np.empty`` (on the CPU whatever default device is active).
    ``dtype``: float32, float64 or bfloat16 (the numba paths). An empty output has torch's C-order
    strides, as the ops' fake implementations give it.
    """
    np_dtype = _NP_DTYPES[dtype]
    if 0 in shape:                       # NumPy strides an empty array (0, ...); torch (and the fakes) C-order
        t = torch.empty(tuple(shape), dtype=dtype, device="cpu")
        return t, (t.view(torch.uint16) if dtype == torch.bfloat16 else t).numpy()
    arr = (OUTPUTS.empty(tuple(shape), np_dtype) if OUTPUTS.caches(math.prod(shape) * np_dtype.itemsize)
           else np.empty(shape, np_dtype))                    # small: 1 us (torch.empty and .numpy(): 3 us)
    t = torch.from_numpy(arr)
    return (t.view(dtype) if dtype == torch.bfloat16 else t), arr


def np_view(t: torch.Tensor) -> np.ndarray:
    """The zero-copy NumPy view of a CPU tensor (strided when the tensor is not contiguous; bf16 as
    uint16 bit patterns). ``numpy(force=True)`` detaches inside one C++ call (0.5 us less than a
    ``detach()`` first); on a CPU tensor of a real dtype it shares the memory like ``numpy()``. A bf16
    tensor's uint16 view never requires grad (an integer tensor cannot), so it needs no detach. Each
    extra torch call costs 10-30 us when the caches are cold, as they are after a large kernel."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy()
    return t.numpy(force=True)
