"""Compiled (numba) cores of the fused row-sparse optimiser updates of ``tokenpos.kernels.optim``.

Shapes: V rows (vocab), D row width, U unique row indices (strictly increasing int64), rows (U, D).
One row update each (Adam, SparseAdam, SGD), driven by a lazy loop (the listed rows only, in
parallel over U) or an exact loop (every row, in parallel over chunks of rows). The formulas and the
modes are described in ``tokenpos.kernels.optim``; the checks and dtype handling live there too.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from tokenpos.kernels._prefetch import prefetch_row, prefetch_row_l2


@njit(inline="always", cache=True)
def _adam_row(p, m, v, g, has_g, step_size, inv_bc2_sqrt, b1, b2, c1, c2, eps, l2, decay):  # pragma: no cover
    """One row of Adam in the scalars' dtype (the parameter dtype); c1 = 1 - b1, c2 = 1 - b2."""
    zero = eps - eps
    for d in range(p.shape[0]):
        pv = p[d]
        gd = (g[d] if has_g else zero) + l2 * pv
        md = b1 * m[d] + c1 * gd
        vd = b2 * v[d] + c2 * gd * gd
        m[d] = md
        v[d] = vd
        p[d] = pv * decay - step_size * md / (math.sqrt(vd) * inv_bc2_sqrt + eps)


@njit(inline="always", cache=True)
def _sparse_adam_row(p, m, v, g, neg_step_size, c1, c2, eps):  # pragma: no cover
    """One row of torch.optim.SparseAdam, operation for operation (c1 = 1 - b1, c2 = 1 - b2)."""
    for d in range(p.shape[0]):
        mo = m[d]
        vo = v[d]
        um = (g[d] - mo) * c1
        uv = (g[d] * g[d] - vo) * c2
        numer = um + mo
        vn = uv + vo
        m[d] = numer
        v[d] = vn
        p[d] = p[d] + neg_step_size * (numer / (math.sqrt(vn) + eps))


@njit(parallel=True, cache=True)
def sparse_adam_core(param, exp_avg, exp_avg_sq, indices, rows, neg_step_size, c1, c2, eps):  # pragma: no cover
    U = indices.shape[0]
    for j in prange(U):
        _prefetch_rows(param, exp_avg, exp_avg_sq, indices, j, U)
        r = indices[j]
        _sparse_adam_row(param[r], exp_avg[r], exp_avg_sq[r], rows[j], neg_step_size, c1, c2, eps)


@njit(inline="always", cache=True)
def _prefetch_rows(a, b, c, indices, j, U):  # pragma: no cover
    """Prefetch the scattered rows of a lazy update: 2 rows ahead into L1, 8 ahead into L2."""
    if j + 2 < U:
        r = indices[j + 2]
        prefetch_row(a[r])
        prefetch_row(b[r])
        prefetch_row(c[r])
    if j + 8 < U:
        r = indices[j + 8]
        prefetch_row_l2(a[r])
        prefetch_row_l2(b[r])
        prefetch_row_l2(c[r])


@njit(parallel=True, cache=True)
def adam_lazy_core(param, exp_avg, exp_avg_sq, indices, rows, step_size, inv_bc2_sqrt, b1, b2, c1, c2,
                   eps, l2, decay):  # pragma: no cover
    U = indices.shape[0]
    for j in prange(U):
        _prefetch_rows(param, exp_avg, exp_avg_sq, indices, j, U)
        r = indices[j]
        _adam_row(param[r], exp_avg[r], exp_avg_sq[r], rows[j], True, step_size, inv_bc2_sqrt, b1, b2,
                  c1, c2, eps, l2, decay)


@njit(inline="always", cache=True)
def _chunk_rows(indices, c, chunk, V):  # pragma: no cover
    """Rows [r0, r1) of chunk c of an exact (all rows) pass, and j: the first listed row >= r0."""
    r0 = c * chunk
    return r0, min(V, r0 + chunk), np.searchsorted(indices, r0)


@njit(parallel=True, cache=True)
def adam_exact_core(param, exp_avg, exp_avg_sq, indices, rows, step_size, inv_bc2_sqrt, b1, b2, c1, c2,
                    eps, l2, decay, chunk):  # pragma: no cover
    V = param.shape[0]
    U = indices.shape[0]
    for c in prange((V + chunk - 1) // chunk):
        r0, r1, j = _chunk_rows(indices, c, chunk, V)
        for r in range(r0, r1):
            if j < U and indices[j] == r:
                _adam_row(param[r], exp_avg[r], exp_avg_sq[r], rows[j], True, step_size, inv_bc2_sqrt,
                          b1, b2, c1, c2, eps, l2, decay)
                j += 1
            else:
                _adam_row(param[r], exp_avg[r], exp_avg_sq[r], rows[0], False, step_size, inv_bc2_sqrt,
                          b1, b2, c1, c2, eps, l2, decay)


@njit(inline="always", cache=True)
def _sgd_row(p, buf, g, has_g, lr, mom, damp, nesterov, wd, first):  # pragma: no cover
    for d in range(p.shape[0]):
        pd = np.float64(p[d])
        gd = (np.float64(g[d]) if has_g else 0.0) + wd * pd
        if mom != 0.0:
            if first:
                bd = gd
            else:
                bd = mom * np.float64(buf[d]) + (1.0 - damp) * gd
            buf[d] = bd
            gd = gd + mom * bd if nesterov else bd
        p[d] = pd - lr * gd


@njit(parallel=True, cache=True)
def sgd_lazy_core(param, buf, indices, rows, lr, mom, damp, nesterov, wd, first):  # pragma: no cover
    U = indices.shape[0]
    for j in prange(U):
        if mom != 0.0:
            _prefetch_rows(param, buf, param, indices, j, U)
        else:
            _prefetch_rows(param, param, param, indices, j, U)
        r = indices[j]
        _sgd_row(param[r], buf[r if mom != 0.0 else 0], rows[j], True, lr, mom, damp, nesterov, wd, first)


@njit(parallel=True, cache=True)
def sgd_exact_core(param, buf, indices, rows, lr, mom, damp, nesterov, wd, first, chunk):  # pragma: no cover
    V = param.shape[0]
    U = indices.shape[0]
    for c in prange((V + chunk - 1) // chunk):
        r0, r1, j = _chunk_rows(indices, c, chunk, V)
        for r in range(r0, r1):
            has = j < U and indices[j] == r
            _sgd_row(param[r], buf[r if mom != 0.0 else 0], rows[j if has else 0], has, lr, mom, damp, nesterov,
                     wd, first)
            if has:
                j += 1
