"""Plain-NumPy reference twins of every kernel: the tests' oracle and the ``set_kernels(False)`` path.

Each function has the same signature and semantics as its kernel (same argument checks, same
dropout counters via :func:`tokenpos.tables.formulas.dropout.dropout_multiplier`), written as the obvious
array expression. Forwards use the same arithmetic order as the kernels, so they agree bit for bit;
backward sums and optimiser updates agree to float rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.kernels.embedding import _flat_pos_ids, _float_array, prepare_forward
from tokenpos.kernels.optim import prepare_sparse
from tokenpos.kernels.rope import prepare_rope
from tokenpos.tables.checks.validation import check_probability, check_token_ids
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.dropout import dropout_multiplier

# ----------------------------------------------------------------------------------------------
# embedding
# ----------------------------------------------------------------------------------------------


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16/int16) -> float32 of exactly the same values."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even; NaN -> 0x7FC0 (``Tensor.bfloat16()``)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def embedding_forward_ref(weight: Any, ids: Any, *, scale: float = 1.0, pos_table: Any = None,
                          pos_ids: Any = None, dropout_p: float = 0.0, seed: int = 0,
                          dropout_offset: int = 0, out: np.ndarray | None = None,
                          bf16: bool = False) -> np.ndarray:
    """Twin of :func:`tokenpos.kernels.embedding_forward`; (...) ids -> (..., D)."""
    w, idx, pt, pid, p = prepare_forward(weight, ids, pos_table, pos_ids, dropout_p, bf16=bf16)
    if bf16:
        w, pt = bf16_to_float32(w), (None if pt is None else bf16_to_float32(pt))
    typ = w.dtype.type
    y = w[idx] * typ(scale)                                             # (..., D)
    if pt is not None:
        n = idx.size
        full = pid[np.arange(n) % pid.size].reshape(idx.shape)          # (...)
        y = y + pt[full]
    if p > 0.0:
        with np.errstate(invalid="ignore"):                             # NaN/Inf * 0 -> NaN, as torch
            y = y * dropout_multiplier(seed, y.shape, p, offset=dropout_offset, dtype=y.dtype)
    y = float32_to_bf16(y) if bf16 else y.astype(w.dtype, copy=False)
    if out is not None:
        out[...] = y.view(out.dtype) if bf16 else y
        return out
    return y


def embedding_backward_ref(grad_out: Any, ids: Any, *, scale: float = 1.0, dropout_p: float = 0.0,
                           seed: int = 0, dropout_offset: int = 0, padding_idx: int | None = None,
                           pos_ids: Any = None, num_positions: int | None = None):
    """Twin of :func:`tokenpos.kernels.embedding_backward`, computed in float64 with ``np.add.at``."""
    g = _float_array("grad_out", grad_out, np.ndim(grad_out))
    idx = check_token_ids(ids, np.iinfo(np.int64).max)
    p = check_probability("dropout_p", dropout_p)
    D = g.shape[-1]
    g64 = g.astype(np.float64).reshape(-1, D)                           # (N, D)
    if p > 0.0:
        with np.errstate(invalid="ignore"):
            g64 = g64 * dropout_multiplier(seed, g64.shape, p, offset=dropout_offset, dtype=np.float64)
    flat = idx.reshape(-1)
    uniq = np.unique(flat)
    if padding_idx is not None:
        uniq = uniq[uniq != padding_idx]
    rows = np.zeros((uniq.size, D))
    sel = np.isin(flat, uniq)
    np.add.at(rows, np.searchsorted(uniq, flat[sel]), g64[sel])
    rows *= float(scale)
    pos_grad = None
    if pos_ids is not None:
        P = 0 if num_positions is None else int(num_positions)
        pid = _flat_pos_ids(pos_ids, idx.shape, P)
        full = pid[np.arange(flat.size) % pid.size]
        pos_grad = np.zeros((P, D))
        np.add.at(pos_grad, full, g64)
        pos_grad = pos_grad.astype(g.dtype)
    return uniq.astype(np.int64), rows.astype(g.dtype), pos_grad


# ----------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------


def _rope_ref_one(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str, sign: float) -> np.ndarray:
    R2 = cos.shape[-1]
    R = 2 * R2
    ct = np.result_type(x.dtype, cos.dtype)
    c = cos.astype(ct)[:, None]                                         # (Bc, 1, L, R/2)
    s = sin.astype(ct)[:, None] * ct.type(sign)
    xr = x[..., :R].astype(ct)
    if layout == "half":
        x1, x2 = xr[..., :R2], xr[..., R2:]
        rot = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = np.empty_like(xr)
        rot[..., 0::2] = x1 * c - x2 * s
        rot[..., 1::2] = x2 * c + x1 * s
    out = x.copy()
    out[..., :R] = rot.astype(x.dtype)
    return out


def _gathered(c: np.ndarray, s: np.ndarray, pos: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables (Bc, L, R/2) of the checked arguments: with positions (Bp * L,), the rows they index."""
    if not pos.size:
        return c, s
    idx = pos.reshape(-1, length)
    return c[idx], s[idx]


def rope_apply_ref(q: Any, k: Any, cos: Any, sin: Any, *, layout: str = "half", out_q: Any = None,
                   out_k: Any = None, positions: Any = None):
    """Twin of :func:`tokenpos.kernels.rope_apply`; returns ``(q_rot, k_rot or None)``."""
    q, k, c, s, layout, pos = prepare_rope(q, k, cos, sin, layout, positions)
    c, s = _gathered(c, s, pos, q.shape[2])
    return _rope_ref_one(q, c, s, layout, 1.0), (None if k is None else _rope_ref_one(k, c, s, layout, 1.0))


def rope_apply_backward_ref(grad_q: Any, grad_k: Any, cos: Any, sin: Any, *, layout: str = "half",
                            out_q: Any = None, out_k: Any = None, positions: Any = None):
    """Twin of :func:`tokenpos.kernels.rope_apply_backward` (the transpose rotation)."""
    g, gk, c, s, layout, pos = prepare_rope(grad_q, grad_k, cos, sin, layout, positions)
    c, s = _gathered(c, s, pos, g.shape[2])
    return _rope_ref_one(g, c, s, layout, -1.0), (None if gk is None else _rope_ref_one(gk, c, s, layout, -1.0))


# ----------------------------------------------------------------------------------------------
# optimisers (dense references; "exact" mode must equal these with a dense gradient)
# ----------------------------------------------------------------------------------------------


def dense_grad(shape: tuple[int, int], indices: Any, rows: Any) -> np.ndarray:
    """The dense (V, D) gradient that is ``rows`` at ``indices`` and zero elsewhere."""
    g = np.zeros(shape, dtype=np.asarray(rows).dtype)
    g[np.asarray(indices)] = rows
    return g


def adam_dense_ref(param: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, grad: np.ndarray, *,
                   step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                   weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """torch.optim.Adam / AdamW (non-amsgrad) on a dense gradient, in place, computed in float64."""
    p = param.astype(np.float64)
    g = grad.astype(np.float64)
    if weight_decay:
        if decoupled:
            p = p * (1.0 - lr * weight_decay)
        else:
            g = g + weight_decay * p
    m = beta1 * exp_avg.astype(np.float64) + (1.0 - beta1) * g
    v = beta2 * exp_avg_sq.astype(np.float64) + (1.0 - beta2) * g * g
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    p = p - (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
    param[...] = p
    exp_avg[...] = m
    exp_avg_sq[...] = v


def adam_lazy_ref(param: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, indices: Any, rows: Any,
                  *, step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                  weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """Lazy Adam: the dense formula applied to the given rows only (global step for bias correction)."""
    idx, r = prepare_sparse(param, indices, rows)
    p, m, v = param[idx], exp_avg[idx], exp_avg_sq[idx]
    adam_dense_ref(p, m, v, r, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                   weight_decay=weight_decay, decoupled=decoupled)
    param[idx], exp_avg[idx], exp_avg_sq[idx] = p, m, v


def sgd_dense_ref(param: np.ndarray, grad: np.ndarray, *, lr: float, momentum: float = 0.0,
                  dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                  momentum_buffer: np.ndarray | None = None, first_step: bool = False) -> None:
    """torch.optim.SGD on a dense gradient, in place (float64 math). ``first_step``: buffer = grad."""
    p = param.astype(np.float64)
    g = grad.astype(np.float64)
    if weight_decay:
        g = g + weight_decay * p
    if momentum:
        if momentum_buffer is None:
            raise ValueError("momentum != 0 needs a momentum_buffer")
        if first_step:
            buf = g.copy()
        else:
            buf = momentum * momentum_buffer.astype(np.float64) + (1.0 - dampening) * g
        momentum_buffer[...] = buf
        g = g + momentum * buf if nesterov else buf
    param[...] = p - lr * g


def sgd_lazy_ref(param: np.ndarray, indices: Any, rows: Any, *, lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 momentum_buffer: np.ndarray | None = None, first_step: bool = False) -> None:
    """Lazy SGD: the dense formula on the given rows only."""
    idx, r = prepare_sparse(param, indices, rows)
    p = param[idx]
    buf = None if momentum_buffer is None else momentum_buffer[idx]
    sgd_dense_ref(p, r, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                  weight_decay=weight_decay, momentum_buffer=buf, first_step=first_step)
    param[idx] = p
    if momentum_buffer is not None and buf is not None:
        momentum_buffer[idx] = buf


# ----------------------------------------------------------------------------------------------
# tied loss
# ----------------------------------------------------------------------------------------------


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _check_block(z: np.ndarray, t: np.ndarray, coef: np.ndarray | None, lse: np.ndarray | None) -> None:
    """z (c, Vl) writeable C-contiguous float32 / float64, t (c,) int64 in [-1, Vl), coef and lse (c,) of z's
    dtype, lse only with coef.

    Raises:
        ConfigError: any other array, naming it, its dtype and shape.
    """
    if z.ndim != 2 or z.dtype not in _FLOATS or not z.flags.c_contiguous or not z.flags.writeable:
        raise ConfigError(f"z must be a writeable C-contiguous float32/float64 array of shape (c, Vl), got "
                          f"{z.dtype} {z.shape}")
    c, Vl = z.shape
    if t.shape != (c,) or t.dtype != np.int64 or (c and (int(t.max()) >= Vl or int(t.min()) < -1)):
        raise ConfigError(f"t must be an int64 array of shape ({c},) with values in [-1, {Vl}), got {t.dtype} "
                          f"{t.shape}")
    for name, a in (("coef", coef), ("lse", lse)):
        if a is not None and (a.shape != (c,) or a.dtype != z.dtype):
            raise ConfigError(f"{name} must be a {z.dtype} array of shape ({c},), got {a.dtype} {a.shape}")
    if lse is not None and coef is None:
        raise ConfigError("lse is only used with coef (the gradient from a given lse)")


def tied_loss_block_ref(z: np.ndarray, t: np.ndarray, *, coef: np.ndarray | None = None,
                        lse: np.ndarray | None = None, eps: float = 0.0, vocab_size: int | None = None,
                        softcap: float | None = None) -> np.ndarray:
    """Twin of :func:`tokenpos.kernels.triton.tied_loss.tied_loss_block` (its module doc has the formulas) on
    NumPy arrays: the same formulas on whole rows (no online log-sum-exp), the Triton kernel's test oracle.

    z (c, Vl) float32 / float64 logits, overwritten (soft-capped; the gradient when ``coef`` is given), t (c,)
    int64 target columns (-1: none here), coef (c,) each token's gradient weight, lse (c,) a given log-sum-exp
    -> stats (c, 4) = (max, sum of exp(z - max), z at the target or 0, sum of z) of the capped logits, or
    (0, 4) with ``lse``. ``vocab_size`` (default Vl) divides the label smoothing ``eps``.

    Raises:
        ConfigError: arrays of other shapes or dtypes, a target column out of [-1, Vl) (``_check_block``).
    """
    _check_block(z, t, coef, lse)
    c, Vl = z.shape
    V = Vl if vocab_size is None else int(vocab_size)
    typ = z.dtype.type
    if softcap is not None:
        z[...] = typ(softcap) * np.tanh(z / typ(softcap))
    rows = np.arange(c)
    here = t >= 0
    zt = np.where(here, z[rows, np.where(here, t, 0)], typ(0.0))
    stats = np.empty((0, 4), z.dtype)
    if lse is None:
        m = z.max(axis=1) if Vl else np.full(c, -np.inf, z.dtype)
        stats = np.stack([m, np.exp(z - m[:, None]).sum(axis=1), zt, z.sum(axis=1)], axis=1).astype(z.dtype)
        if coef is None:
            return stats
        lse = (stats[:, 0] + np.log(stats[:, 1])).astype(z.dtype)
    assert coef is not None
    g = coef[:, None] * np.exp(z - lse[:, None]) - (coef * typ(eps / V))[:, None]
    g[rows[here], t[here]] -= coef[here] * typ(1.0 - eps)
    if softcap is not None:
        g *= typ(1.0) - (z / typ(softcap)) ** 2
    z[...] = g
    return stats
