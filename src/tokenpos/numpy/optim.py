"""Optimisers for the NumPy backend: SGD (momentum) and Adam / AdamW, dense or row-sparse.

Row-sparse gradients (embedding tables) have these modes:

- ``sparse_mode="exact"``: the result is identical (to float rounding) to the dense optimiser fed a
  gradient that is zero on the unused rows. Adam's moments decay on every row and every row with a
  non-zero moment moves, so each step touches the whole table: exact, but O(V * D).
- ``sparse_mode="lazy"``: only the rows used in this step are touched (moments, weight decay and the
  update). Unused rows keep stale moments and are not decayed; the bias correction uses the
  parameter's step count (the steps in which it had a gradient), not a per-row count. The rows that
  move follow dense Adam's formula (``denom = sqrt(v) / sqrt(1 - b2^t) + eps``), so this is NOT
  bit-for-bit ``torch.optim.SparseAdam``, which uses ``denom = sqrt(v) + eps`` and ``step_size =
  lr * sqrt(1 - b2^t) / (1 - b1^t)``: its eps is in effect ``eps / sqrt(1 - b2^t)`` of ours (31.6x at
  step 1 with b2 = 0.999, 1.0x after a few thousand steps). Cost O(rows used * D), after the
  optimiser state is allocated at the first step. For plain SGD without momentum or weight decay
  all modes are the same.
- ``sparse_mode="sparse_adam"`` (Adam only): exactly ``torch.optim.SparseAdam`` (same formula, same
  float operations in the same order; tested against it: bit for bit wherever torch's float32 sqrt is
  correctly rounded, within a few ulp on CPUs where it is not), lazy rows, no weight decay (SparseAdam has
  none). Dense gradients (a bias, a norm weight) get the same formula on every element. float16
  parameters keep float32 moments (SparseAdam would keep float16 ones).

The dense update formulas follow torch.optim exactly (``denom = sqrt(v) / sqrt(1 - b2^t) + eps``,
AdamW decays ``p *= 1 - lr * wd`` before the step), so the torch and NumPy backends train alike.

State safety: ``load_state_dict`` checks the whole state before it changes anything, and ``step``
checks that every state still fits its parameter before it updates anything; counters move only
after the update succeeds. After ``TokenEmbedding.resize()`` the old moments no longer fit: ``step``
raises StateDictError without changing anything (create a new optimiser for the resized table).
Shapes: a parameter (V, D) or (D,); a sparse gradient has ids (n,) and rows (n, D).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tokenpos._config import kernels_enabled
from tokenpos.kernels.optim import sparse_adam_step_size, sparse_adam_update, sparse_sgd_update
from tokenpos.numpy.module import Parameter
from tokenpos.numpy.optim_state import check_optimizer_state, check_state_fits
from tokenpos.tables.checks.validation import check_choice, check_float
from tokenpos.tables.errors import ConfigError

SPARSE_MODES = ("exact", "lazy")
ADAM_SPARSE_MODES = (*SPARSE_MODES, "sparse_adam")


class Optimizer:
    """Holds the parameter list and per-parameter state; subclasses define ``_update``."""

    SPARSE_MODES: tuple[str, ...] = SPARSE_MODES

    def __init__(self, params: Iterable[Parameter], lr: float, sparse_mode: str) -> None:
        self.params = list(params)
        if not self.params:
            raise ConfigError("optimizer got an empty parameter list; expected at least one Parameter")
        for p in self.params:
            if not isinstance(p, Parameter):
                raise ConfigError(f"optimizer expects tokenpos.numpy Parameters, got {type(p).__name__}")
        first: dict[int, int] = {}
        for i, p in enumerate(self.params):     # a tied Parameter given twice would be updated twice per step
            j = first.setdefault(id(p), i)
            if j != i:
                raise ConfigError(f"optimizer got the same Parameter at indices {j} and {i} (a tied weight?); "
                                  f"expected each Parameter once (Module.parameters() lists a tied one once)")
        self.lr = check_float("lr", lr, low=0.0)
        self.sparse_mode = check_choice("sparse_mode", sparse_mode, self.SPARSE_MODES)
        self.state: dict[int, dict[str, Any]] = {}
        self.step_count = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.zero_grad()

    def step(self) -> None:
        """Apply one update from the accumulated gradients (parameters without one are skipped).

        Raises:
            StateDictError: a parameter no longer fits its state (resized); nothing has changed then.
        """
        work = [(i, p) for i, p in enumerate(self.params) if p.requires_grad and p.has_grad]
        for i, p in work:
            check_state_fits(i, p, self.state.get(id(p), {}))
        for _, p in work:
            state = self.state.setdefault(id(p), {})
            sparse = p.sparse_grad
            if sparse is not None:
                self._update(p, state, None, sparse.indices, sparse.rows)
            else:
                self._update(p, state, p.grad, None, None)
        self.step_count += 1

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
        """Restore ``state_dict()`` output after checking all of it; nothing changes on error.

        Raises:
            StateDictError: an unknown key, a missing ``step_count``, an incomplete per-parameter entry
                (``m`` without ``v`` or ``step``), a wrong shape or dtype, a negative count or ``v``.
        """
        self.state, self.step_count = check_optimizer_state(state, self.params, self.STATE_NAMES,
                                                            self._state_dtype)

    def save(self, path: str | Path) -> None:
        """Write ``state_dict()`` as a safetensors file (never pickle), with this class in its metadata."""
        from tokenpos.tables.checkpoint import write_numpy

        write_numpy(self.state_dict(), path, type(self).__name__)

    def load(self, path: str | Path) -> None:
        """Load a file written by ``save`` into this optimiser (same parameters, same order).

        Raises:
            StateDictError: naming the file: missing, unreadable, not safetensors, or written by another class.
        """
        from tokenpos.tables.checkpoint import class_names, read_checkpoint

        self.load_state_dict(read_checkpoint(path, class_names(self)))

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
    SPARSE_MODES = ADAM_SPARSE_MODES

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
        if self.sparse_mode == "sparse_adam" and self.weight_decay:
            raise ConfigError(f"sparse_mode 'sparse_adam' follows torch.optim.SparseAdam, which has no weight decay; "
                              f"got weight_decay={self.weight_decay}, expected 0.0 (or sparse_mode 'lazy')")

    def _update(self, p, state, grad, ids, rows):  # type: ignore[no-untyped-def]
        if "m" in state:
            m, v = state["m"], state["v"]
        else:   # float16 parameters keep float32 moments: (1 - b2) * g * g and eps underflow in float16
            sdt = self._state_dtype(p, "m")
            m, v = np.zeros(p.data.shape, sdt), np.zeros(p.data.shape, sdt)
        t = int(state.get("step", 0)) + 1           # the counter moves only after the update succeeded
        if self.sparse_mode == "sparse_adam":
            self._sparse_adam(p, m, v, t, grad, ids, rows)
        else:
            self._adam(p, m, v, t, grad, ids, rows)
        state["m"], state["v"], state["step"] = m, v, t

    def _adam(self, p, m, v, t, grad, ids, rows):  # type: ignore[no-untyped-def]
        b1, b2, lr, wd = self.beta1, self.beta2, self.lr, self.weight_decay
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

    def _sparse_adam(self, p, m, v, t, grad, ids, rows):  # type: ignore[no-untyped-def]
        """torch.optim.SparseAdam, operation for operation, on the listed rows (all rows for a dense grad)."""
        if ids is not None and _use_kernel(p) and m.dtype == p.dtype:
            sparse_adam_update(p.data, m, v, ids, rows, step=t, lr=self.lr, beta1=self.beta1, beta2=self.beta2,
                               eps=self.eps, mode="sparse_adam")
            return
        sel: Any = ids if ids is not None else slice(None)
        typ = m.dtype.type
        g = (rows if ids is not None else grad).astype(m.dtype, copy=False)
        mo, vo = m[sel], v[sel]
        um = (g - mo) * typ(1.0 - self.beta1)
        uv = (g * g - vo) * typ(1.0 - self.beta2)
        numer, vn = um + mo, uv + vo
        m[sel], v[sel] = numer, vn
        update = typ(-sparse_adam_step_size(self.lr, self.beta1, self.beta2, t)) * (numer / (np.sqrt(vn)
                                                                                         + typ(self.eps)))
        p.data[sel] = (p.data[sel].astype(m.dtype) + update).astype(p.dtype)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default weight_decay 0.01 as torch."""

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, sparse_mode: str = "exact") -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decoupled_weight_decay=True, sparse_mode=sparse_mode)
