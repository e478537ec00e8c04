"""Fused row-sparse optimiser updates (SGD with momentum, Adam, AdamW), in place.

Shapes: V rows (vocab), D row width, U unique row indices. The gradient comes row-sparse, as from
:func:`tokenpos.kernels.embedding_backward`: ``indices`` (U,) unique, strictly increasing int64 and
``rows`` (U, D). Adam's element math is in the parameter dtype (float32 for float32 tables, as
torch's fused Adam; scalars such as ``lr / (1 - beta1**t)`` are formed in float64 first). SGD's is
float64, rounded once to the parameter dtype.

Two modes:

- ``"exact"``: identical (to float rounding) to the dense torch optimiser given the dense gradient
  that is ``rows`` at ``indices`` and zero elsewhere. Every row's moments decay and every row with
  a nonzero moment moves, so this is a dense pass over (V, D) (parameter + state), but no dense
  gradient is ever built. (Plain SGD without momentum or weight decay only touches ``indices``, as
  the dense update is zero elsewhere.)
- ``"lazy"``: only the rows in ``indices`` are read and written, with dense Adam's formula on them
  (``denom = sqrt(v) / sqrt(1 - b2^t) + eps``). Bias correction uses the parameter's ``step``
  (one counter per parameter, as SparseAdam), not a per-row count. Weight decay (L2 or decoupled)
  applies to the updated rows only. This is *not* bit-for-bit ``torch.optim.SparseAdam``: that one
  places eps outside the bias correction (``denom = sqrt(v) + eps``, ``step_size = lr * sqrt(1 - b2^t)
  / (1 - b1^t)``), i.e. its effective eps is ``eps / sqrt(1 - b2^t)`` here, larger in early steps.
- ``"sparse_adam"`` (Adam only): exactly ``torch.optim.SparseAdam`` (same formula and the same float
  operations in the same order: ``m += (1 - b1) * (g - m)``, ``v += (1 - b2) * (g * g - v)``,
  ``p += -step_size * (m / (sqrt(v) + eps))``, with an IEEE sqrt), listed rows only; no weight decay
  (SparseAdam has none). Bit for bit wherever torch's own float32 sqrt is correctly rounded; on some
  CPUs it is not (an AVX-512 AMD EPYC, torch 2.13: 1 ulp off on 20 % of values), and the parameters
  then differ from torch's by a few ulp.

Adam follows ``torch.optim.Adam`` / ``AdamW`` (amsgrad off): with ``decoupled=False`` weight decay
is L2 (``g += wd * p``); with ``decoupled=True`` (AdamW) ``p -= lr * wd * p`` first.
SGD follows ``torch.optim.SGD``; its momentum buffer is ``g`` itself on the first step.

This module checks the arrays and forms the scalars; the compiled row loops live in
``tokenpos.kernels._optim_cores``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tokenpos.kernels._launch import launch
from tokenpos.kernels._optim_cores import (
    adam_exact_core,
    adam_lazy_core,
    sgd_exact_core,
    sgd_lazy_core,
    sparse_adam_core,
)
from tokenpos.kernels._threading import parallel
from tokenpos.tables.checks.validation import check_choice
from tokenpos.tables.errors import ConfigError

MODES = ("exact", "lazy")
ADAM_MODES = (*MODES, "sparse_adam")


def _state(name: str, arr: Any, param: np.ndarray) -> np.ndarray:
    if (not isinstance(arr, np.ndarray) or arr.shape != param.shape or arr.dtype != param.dtype
            or not arr.flags.c_contiguous or not arr.flags.writeable):
        raise ConfigError(f"{name} must be a writeable C-contiguous {param.dtype} array of shape {param.shape}")
    return arr


def prepare_sparse(param: Any, indices: Any, rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check (param, indices, rows); returns contiguous int64 indices and rows of the param dtype."""
    if (not isinstance(param, np.ndarray) or param.ndim != 2 or param.dtype not in (np.float32, np.float64)
            or not param.flags.c_contiguous or not param.flags.writeable):
        raise ConfigError("param must be a writeable C-contiguous float32/float64 array of shape (V, D)")
    idx = np.ascontiguousarray(np.asarray(indices).reshape(-1), dtype=np.int64)
    r = np.ascontiguousarray(rows, dtype=param.dtype)
    if r.shape != (idx.shape[0], param.shape[1]):
        raise ConfigError(f"rows must have shape ({idx.shape[0]}, {param.shape[1]}), got {r.shape}")
    if idx.size and (idx[0] < 0 or idx[-1] >= param.shape[0] or np.any(idx[1:] <= idx[:-1])):
        raise ConfigError(f"indices must be strictly increasing and in [0, {param.shape[0]})")
    return idx, r


def _chunk(V: int) -> int:
    return max(16, min(1024, -(-V // 64)))


def sparse_adam_update(param: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, indices: Any,
                       rows: Any, *, step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999,
                       eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False,
                       mode: str = "lazy") -> None:
    """Adam / AdamW step from a row-sparse gradient, in place.

    Args:
        param, exp_avg, exp_avg_sq: (V, D) C-contiguous arrays of one float dtype (state starts at 0).
        indices: (U,) strictly increasing row ids; rows: (U, D) gradient rows.
        step: this step's number, 1 for the first call (the caller increments it).
        decoupled: False = Adam with L2 weight decay, True = AdamW.
        mode: "exact" (equals dense Adam with zero rows elsewhere), "lazy" (listed rows only) or
            "sparse_adam" (listed rows only, exactly torch.optim.SparseAdam; weight_decay must be 0).
    """
    check_choice("mode", mode, ADAM_MODES)
    idx, r = prepare_sparse(param, indices, rows)
    m = _state("exp_avg", exp_avg, param)
    v = _state("exp_avg_sq", exp_avg_sq, param)
    if int(step) < 1:
        raise ConfigError(f"step must be >= 1, got {step}")
    if mode == "sparse_adam":
        _sparse_adam(param, m, v, idx, r, int(step), lr, beta1, beta2, eps, weight_decay)
        return
    step_size = lr / (1.0 - beta1 ** int(step))
    inv_bc2_sqrt = 1.0 / math.sqrt(1.0 - beta2 ** int(step))
    l2 = 0.0 if decoupled else float(weight_decay)
    decay = 1.0 - lr * weight_decay if decoupled else 1.0
    if r.shape[0] == 0:
        r = np.zeros((1, param.shape[1]), param.dtype)
    typ = param.dtype.type                 # element math in the parameter dtype, as torch's fused Adam
    args = tuple(typ(x) for x in (step_size, inv_bc2_sqrt, beta1, beta2, 1.0 - beta1, 1.0 - beta2, eps, l2,
                                  decay))
    D, isz = param.shape[1], param.itemsize
    if mode == "lazy":
        if idx.size:
            with launch(idx.size, 7 * idx.size * D * isz):
                parallel(adam_lazy_core)(param, m, v, idx, r, *args)
    elif param.size:
        chunk = _chunk(param.shape[0])
        with launch(-(-param.shape[0] // chunk), 6 * param.size * isz, max_chunk=1):
            parallel(adam_exact_core)(param, m, v, idx, r, *args, chunk)  # type: ignore[call-arg]


def sparse_adam_step_size(lr: float, beta1: float, beta2: float, step: int) -> float:
    """torch.optim.SparseAdam's step size ``lr * sqrt(1 - b2^t) / (1 - b1^t)`` (float64)."""
    return lr * math.sqrt(1.0 - beta2 ** int(step)) / (1.0 - beta1 ** int(step))


def _sparse_adam(param: np.ndarray, m: np.ndarray, v: np.ndarray, idx: np.ndarray, r: np.ndarray, step: int,
                 lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    if float(weight_decay) != 0.0:
        raise ConfigError(f"mode 'sparse_adam' follows torch.optim.SparseAdam, which has no weight decay; got "
                          f"weight_decay={weight_decay}, expected 0.0 (or mode 'lazy')")
    if not idx.size:
        return
    typ = param.dtype.type              # element math in the parameter dtype, as SparseAdam on that dtype
    args = (typ(-sparse_adam_step_size(lr, beta1, beta2, step)), typ(1.0 - beta1), typ(1.0 - beta2), typ(eps))
    with launch(idx.size, 7 * idx.size * param.shape[1] * param.itemsize):
        parallel(sparse_adam_core)(param, m, v, idx, r, *args)


def sparse_sgd_update(param: np.ndarray, indices: Any, rows: Any, *, lr: float, momentum: float = 0.0,
                      dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                      momentum_buffer: np.ndarray | None = None, first_step: bool = False,
                      mode: str = "lazy") -> None:
    """SGD (optional momentum, L2 weight decay) from a row-sparse gradient, in place.

    Args:
        param: (V, D); momentum_buffer: (V, D) of the same dtype when ``momentum != 0``.
        first_step: the buffer is set to the gradient instead of decayed (torch's first step).
        mode: "exact" or "lazy" (see the module docstring).
    """
    check_choice("mode", mode, MODES)
    idx, r = prepare_sparse(param, indices, rows)
    mom = float(momentum)
    if mom != 0.0:
        buf = _state("momentum_buffer", momentum_buffer, param)
    else:
        buf = param[:1]
    if r.shape[0] == 0:
        r = np.zeros((1, param.shape[1]), param.dtype)
    args = (float(lr), mom, float(dampening), bool(nesterov), float(weight_decay), bool(first_step))
    dense_needed = mom != 0.0 or float(weight_decay) != 0.0
    D, isz = param.shape[1], param.itemsize
    if mode == "lazy" or not dense_needed:
        if idx.size:
            with launch(idx.size, 5 * idx.size * D * isz):
                parallel(sgd_lazy_core)(param, buf, idx, r, *args)
    elif param.size:
        chunk = _chunk(param.shape[0])
        with launch(-(-param.shape[0] // chunk), 4 * param.size * isz, max_chunk=1):
            parallel(sgd_exact_core)(param, buf, idx, r, *args, chunk)
