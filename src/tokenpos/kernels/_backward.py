"""Compiled cores of the embedding backward: unique ids, counting-sort grouping, segment sums.

Shapes: N flat ids/rows, D model dim, U unique ids (segments), V largest id + 1.
The dropout mask is recomputed from the seed; dropped elements contribute ``grad * 0`` (a
multiply, so a NaN gradient stays NaN, as in ``torch.nn.Dropout``'s backward).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tokenpos.kernels._prefetch import prefetch_row, prefetch_row_l2
from tokenpos.kernels._rng import key_of, multiplier_row


@njit(cache=True)
def _unique_inverse(ids, padding_idx):  # pragma: no cover
    """Sorted unique ids (padding_idx left out) and, per id, its slot in them (-1 for padding).

    O(N + V) with one (V,) int32 mark table: no sort.
    """
    N = ids.shape[0]
    V = 0
    for n in range(N):
        V = max(V, ids[n] + 1)
    slot = np.zeros(V, np.int32)
    for n in range(N):
        slot[ids[n]] = 1
    if 0 <= padding_idx < V:
        slot[padding_idx] = 0
    U = 0
    for v in range(V):
        if slot[v]:
            U += 1
    uniq = np.empty(U, np.int64)
    u = 0
    for v in range(V):
        if slot[v]:
            uniq[u] = v
            slot[v] = u
            u += 1
        else:
            slot[v] = -1
    inverse = np.empty(N, np.int64)
    for n in range(N):
        inverse[n] = slot[ids[n]]
    return uniq, inverse


@njit(cache=True)
def _group(keys, nkeys, period):  # pragma: no cover
    """Counting sort of rows by key: rows of key s are ``order[starts[s]:starts[s+1]]``.

    Row n has key ``keys[n % period]`` (period = len(keys) unless positions broadcast); keys < 0
    (padding) are left out.
    """
    N = keys.shape[0] if period == 0 else period
    starts = np.zeros(nkeys + 1, np.int64)
    for n in range(N):
        kk = keys[n % keys.shape[0]]
        if kk >= 0:
            starts[kk + 1] += 1
    for s in range(nkeys):
        starts[s + 1] += starts[s]
    fill = starts[:-1].copy()
    order = np.empty(starts[nkeys], np.int64)
    for n in range(N):
        kk = keys[n % keys.shape[0]]
        if kk >= 0:
            order[fill[kk]] = n
            fill[kk] += 1
    return starts, order


@njit(parallel=True, cache=True)
def _segment_sum_core(grad, order, starts, seed, thr, offset, factor, ahead, far, out):  # pragma: no cover
    """out[s] = factor * sum over rows n in segment s of the masked grad[n] (float64 sums); ``seed``:
    the dropout seed bits (``_rng.dropout_params``).

    Parallel over segments (dynamic chunks keep a hot Zipf id from stalling a thread); each sum
    lives in a float64 buffer of one row (L1-resident), and each output row is written once.
    """
    S = starts.shape[0] - 1
    D = grad.shape[1]
    M = order.shape[0]
    key = key_of(seed)
    for s in prange(S):
        acc = np.zeros(D, np.float64)
        m = np.empty(D if thr != 0 else 0, np.float64)    # the row's dropout multiplier (1 or 0)
        for j in range(starts[s], starts[s + 1]):
            if ahead > 0 and j + ahead < M:
                prefetch_row(grad[order[j + ahead]])
            if far > 0 and j + far < M:
                prefetch_row_l2(grad[order[j + far]])
            n = order[j]
            g = grad[n]
            if thr != 0:                                 # grad * m (a multiply: NaN stays NaN)
                multiplier_row(key, thr, 1.0, offset + np.uint64(n * D), m)
                for d in range(D):
                    acc[d] += g[d] * m[d]
            else:
                for d in range(D):
                    acc[d] += g[d]
        o = out[s]
        for d in range(D):
            o[d] = acc[d] * factor
