"""Which implementation an op runs: the ONE place that chooses between the numba kernel, a Triton
kernel and plain torch.

- CPU float32 / float64 with ``tokenpos.kernels_enabled()``: the numba kernel on zero-copy
  ``.numpy()`` views, writing into a fresh output from :func:`cpu_empty` (``out=``).
- CPU bfloat16: the numba bf16 kernel once ``tokenpos.kernels.embedding.embedding_forward`` takes
  ``bf16=True`` (see :data:`NUMBA_BF16`); until then plain torch.
- CUDA float32 / bf16 / fp16: ``tokenpos.kernels.triton`` when it imports (Triton present), else
  plain torch (float64 on CUDA too).
- everything else (fp16, meta, MPS, kernels switched off): plain torch.

The choice is made inside the op's implementation, at run time, on real (unwrapped) tensors, so a
``torch.compile`` graph keeps the op and still follows ``tokenpos.set_kernels``.
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any

import numpy as np
import torch

from tokenpos._config import OUTPUTS, kernels_enabled

NUMBA_DTYPES = (torch.float32, torch.float64)


def _kernel_has_bf16() -> bool:
    from tokenpos.kernels.embedding import embedding_forward

    return "bf16" in inspect.signature(embedding_forward).parameters


NUMBA_BF16: bool = _kernel_has_bf16()     # a static fact of the installed kernel, read once at import


def cpu_path(*tensors: torch.Tensor) -> str:
    """"numba", "numba_bf16" or "plain" for CPU tensors that share one dtype."""
    if not kernels_enabled():
        return "plain"
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        return "plain"
    if dtype in NUMBA_DTYPES:
        return "numba"
    if dtype == torch.bfloat16 and NUMBA_BF16:
        return "numba_bf16"
    return "plain"


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


_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.bfloat16: np.int16}


def cpu_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh, uninitialised CPU tensor for a kernel's output: large ones reuse a released block
    of :data:`tokenpos._config.OUTPUTS` (no page faults; like any ``torch.from_numpy`` tensor its
    storage cannot be resized), small ones, and all when the cache is off, are ``torch.empty``."""
    shape = tuple(int(n) for n in shape)
    if dtype not in _NP_DTYPES or not OUTPUTS.caches(math.prod(shape) * dtype.itemsize):
        return torch.empty(shape, dtype=dtype)
    t = torch.from_numpy(OUTPUTS.empty(shape, _NP_DTYPES[dtype]))
    return t.view(dtype) if dtype == torch.bfloat16 else t


def np_view(t: torch.Tensor) -> np.ndarray:
    """The zero-copy NumPy view of a CPU tensor (strided when the tensor is not contiguous); only a
    tensor that requires grad is detached first (each extra op costs 10-30 us with cold caches)."""
    return (t.detach() if t.requires_grad else t).numpy()


def bf16_view(t: torch.Tensor) -> np.ndarray:
    """The bits of a contiguous CPU bfloat16 tensor as a zero-copy uint16 array."""
    return t.detach().contiguous().view(torch.uint16).numpy()
