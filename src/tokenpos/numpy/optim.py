"""Optimisers for the NumPy backend: SGD (momentum) and Adam / AdamW, dense or row-sparse.

Row-sparse gradients (embedding tables) have two modes:

- ``sparse_mode="exact"``: the result is identical (to float rounding) to the dense optimiser fed a
  gradient that is zero on the unused rows. Adam's moments decay on every row and every row with a
  non-zero moment moves, so each step touches the whole table: exact, but O(V * D).
- ``sparse_mode="lazy"``: only the rows used in this step are touched (moments, weight decay and the
  update), like ``torch.optim.SparseAdam``. Unused rows keep stale moments and are not decayed; the
  bias correction uses the parameter's step count (the steps in which it had a gradient), not a
  per-row count. Cost O(rows used * D), after the optimiser state is allocated at the first step.
  For plain SGD without momentum or weight decay both modes are the same.

The update formulas follow torch.optim exactly (``denom = sqrt(v) / sqrt(1 - b2^t) + eps``, AdamW
decays ``p *= 1 - lr * wd`` before the step), so the torch and NumPy backends train alike.
Shapes: a parameter (V, D) or (D,); a sparse gradient has ids (n,) and rows (n, D).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tokenpos._config import kernels_enabled
from tokenpos.kernels.optim import sparse_adam_update, sparse_sgd_update
from tokenpos.numpy.module import Parameter
from tokenpos.tables.errors import ConfigError, StateDictError
from tokenpos.tables.validation import check_choice, check_float

SPARSE_MODES = ("exact", "lazy")


class Optimizer:
    """Holds the parameter list and per-parameter state; subclasses define ``_update``."""

    def __init__(self, params: Iterable[Parameter], lr: float, sparse_mode: str) -> None:
        self.params = list(params)
        if not self.params:
            raise ConfigError("optimizer got an empty parameter list; expected at least one Parameter")
        for p in self.params:
            if not isinstance(p, Parameter):
                raise ConfigError(f"optimizer expects tokenpos.numpy Parameters, got {type(p).__name__}")
        self.lr = check_float("lr", lr, low=0.0)
        self.sparse_mode = check_choice("sparse_mode", sparse_mode, SPARSE_MODES)
        self.state: dict[int, dict[str, Any]] = {}
        self.step_count = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.zero_grad()

    def step(self) -> None:
        """Apply one update from the accumulated gradients (parameters without one are skipped)."""
        self.step_count += 1
        for p in self.params:
            if not p.requires_grad or not p.has_grad:
                continue
            state = self.state.setdefault(id(p), {})
            sparse = p.sparse_grad
            if sparse is not None:
                self._update(p, state, None, sparse.indices, sparse.rows)
            else:
                self._update(p, state, p.grad, None, None)

    def _update(self, p: Parameter, state: dict[str, Any], grad: np.ndarray | None,
                ids: np.ndarray | None, rows: np.ndarray | None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- checkpoints -----------------------------------------------------------------------------
    STATE_NAMES: tuple[str, ...] = ()

    def _state_dtype(self, p: Parameter, name: str) -> np.dtype:
        return p.data.dtype

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the optimiser state as flat arrays, ready for safetensors.

        Keys: ``step_count`` and, for the i-th parameter given to the constructor, ``"{i}.{name}"``
        (Adam: ``m``, ``v``, ``step``; SGD: ``momentum``). Hyper-parameters are the constructor's
        and are not part of the state.
        """
        out = {"step_count": np.asarray(self.step_count, dtype=np.int64)}
        for i, p in enumerate(self.params):
            for name, value in self.state.get(id(p), {}).items():
                out[f"{i}.{name}"] = np.array(value, dtype=np.int64 if name == "step" else None)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output after checking every entry; nothing changes on error.

        Raises:
            StateDictError: an unknown key, a missing ``step_count``, or a wrong shape or dtype.
        """
        arrays = {k: np.asarray(v) for k, v in state.items()}
        if "step_count" not in arrays or arrays["step_count"].shape != ():
            raise StateDictError("optimizer state_dict needs a scalar 'step_count'; got keys " + str(sorted(arrays)))
        new: dict[int, dict[str, Any]] = {}
        for key, value in arrays.items():
            if key == "step_count":
                continue
            index, _, name = key.partition(".")
            if not index.isdigit() or int(index) >= len(self.params) or name not in self.STATE_NAMES:
                raise StateDictError(f"optimizer state key {key!r} is not expected; expected 'step_count' and "
                                     f"'<i>.<name>' with i < {len(self.params)} and name in {self.STATE_NAMES}")
            p = self.params[int(index)]
            want_shape, want_dtype = ((), np.dtype(np.int64)) if name == "step" else \
                (p.data.shape, self._state_dtype(p, name))
            if value.shape != want_shape or value.dtype != want_dtype:
                raise StateDictError(f"optimizer state {key!r} has shape {value.shape} and dtype {value.dtype}, "
                                     f"expected shape {want_shape} and dtype {want_dtype}")
            new.setdefault(id(p), {})[name] = int(value) if name == "step" else value.copy()
        self.state, self.step_count = new, int(arrays["step_count"])

    def save(self, path: str | Path) -> None:
        """Write ``state_dict()`` as a safetensors file (never pickle)."""
        from safetensors.numpy import save_file

        save_file(self.state_dict(), str(path), metadata={"format": "tokenpos", "class": type(self).__name__})

    def load(self, path: str | Path) -> None:
        """Load a file written by ``save`` into this optimiser (same parameters, same order)."""
        from safetensors.numpy import load_file

        self.load_state_dict(load_file(str(path)))

    @staticmethod
    def _dense_from_rows(p: Parameter, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        g = np.zeros_like(p.data)
        g[ids] = rows
        return g


def _use_kernel(p: Parameter) -> bool:
    """The fused row-sparse kernels take C-contiguous 2-D float32/float64 tables."""
    return (kernels_enabled() and p.data.ndim == 2 and p.data.dtype in (np.float32, np.float64)
            and p.data.flags.c_contiguous)


class SGD(Optimizer):
    """``v = momentum * v + g`` (torch's form, no dampening); ``p -= lr * v``; coupled L2 weight decay."""

    STATE_NAMES = ("momentum",)

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-2, *, momentum: float = 0.0,
                 weight_decay: float = 0.0, sparse_mode: str = "exact") -> None:
        super().__init__(params, lr, sparse_mode)
        self.momentum = check_float("momentum", momentum, low=0.0, high=1.0, high_inclusive=False)
        self.weight_decay = check_float("weight_decay", weight_decay, low=0.0)

    def _update(self, p, state, grad, ids, rows):  # type: ignore[no-untyped-def]
        lr, mom, wd = self.lr, self.momentum, self.weight_decay
        if ids is not None and _use_kernel(p):
            if mom and "momentum" not in state:
                state["momentum"] = np.zeros(p.data.shape, p.data.dtype)
            sparse_sgd_update(p.data, ids, rows, lr=lr, momentum=mom, weight_decay=wd,
                              momentum_buffer=state.get("momentum"), mode=self.sparse_mode)
            return
        if ids is not None and (self.sparse_mode == "lazy" or (mom == 0.0 and wd == 0.0)):
            g = rows + wd * p.data[ids] if wd else rows
            if mom:
                if "momentum" not in state:   # not setdefault: that would build a (V, D) array every step
                    state["momentum"] = np.zeros(p.data.shape, p.data.dtype)
                buf = state["momentum"]
                buf[ids] = mom * buf[ids] + g
                g = buf[ids]
            p.data[ids] -= (lr * g).astype(p.dtype)
            return
        g = self._dense_from_rows(p, ids, rows) if ids is not None else grad
        if wd:
            g = g + wd * p.data
        if mom:
            buf = state.get("momentum")
            buf = g.copy() if buf is None else np.multiply(buf, mom, out=buf) + g
            state["momentum"] = buf
            g = buf
        p.data -= (lr * g).astype(p.dtype)


class Adam(Optimizer):
    """Adam (Kingma & Ba), torch's formulation; ``decoupled_weight_decay=True`` gives AdamW."""

    STATE_NAMES = ("m", "v", "step")

    def _state_dtype(self, p: Parameter, name: str) -> np.dtype:
        return np.dtype(np.float32) if p.data.dtype == np.float16 else p.data.dtype   # fp16: fp32 moments

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                 sparse_mode: str = "exact") -> None:
        super().__init__(params, lr, sparse_mode)
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ConfigError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.beta1 = check_float("betas[0]", betas[0], low=0.0, high=1.0, high_inclusive=False)
        self.beta2 = check_float("betas[1]", betas[1], low=0.0, high=1.0, high_inclusive=False)
        self.eps = check_float("eps", eps, low=0.0)
        self.weight_decay = check_float("weight_decay", weight_decay, low=0.0)
        self.decoupled = bool(decoupled_weight_decay)

    def _update(self, p, state, grad, ids, rows):  # type: ignore[no-untyped-def]
        b1, b2, lr, wd = self.beta1, self.beta2, self.lr, self.weight_decay
        if "m" not in state:
            # float16 parameters keep float32 moments: (1 - b2) * g * g and eps underflow in float16
            sdt = np.float32 if p.dtype == np.float16 else p.dtype
            state["m"], state["v"] = np.zeros(p.data.shape, sdt), np.zeros(p.data.shape, sdt)
            state["step"] = 0
        state["step"] += 1
        t = state["step"]
        m, v = state["m"], state["v"]
        bc1, bc2_sqrt = 1.0 - b1**t, np.sqrt(1.0 - b2**t)
        step_size = lr / bc1
        if ids is not None and _use_kernel(p) and m.dtype == p.dtype:
            sparse_adam_update(p.data, m, v, ids, rows, step=t, lr=lr, beta1=b1, beta2=b2, eps=self.eps,
                               weight_decay=wd, decoupled=self.decoupled, mode=self.sparse_mode)
            return
        lazy = ids is not None and self.sparse_mode == "lazy"
        if lazy:
            w = p.data[ids]
            g = (rows + wd * w if (wd and not self.decoupled) else rows).astype(m.dtype, copy=False)
            if wd and self.decoupled:
                w = w * (1.0 - lr * wd)
            m[ids] = b1 * m[ids] + (1.0 - b1) * g
            v[ids] = b2 * v[ids] + (1.0 - b2) * g * g
            denom = np.sqrt(v[ids]) / bc2_sqrt + self.eps
            p.data[ids] = (w - step_size * m[ids] / denom).astype(p.dtype)
            return
        g = self._dense_from_rows(p, ids, rows) if ids is not None else grad
        if wd and not self.decoupled:
            g = g + wd * p.data
        g = g.astype(m.dtype, copy=False)
        if wd and self.decoupled:
            p.data *= p.dtype.type(1.0 - lr * wd)
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * g * g
        denom = np.sqrt(v) / bc2_sqrt + self.eps
        p.data -= (step_size * m / denom).astype(p.dtype)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default weight_decay 0.01 as torch."""

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, sparse_mode: str = "exact") -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decoupled_weight_decay=True, sparse_mode=sparse_mode)
