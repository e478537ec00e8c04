"""Hashed n-gram lookup (Engram) in one pass: hash the last n ids of each token and gather its heads' rows.

Shapes: T tokens (flat; a (B, L) batch is B documents of L), S documents, C context ids per document,
n_max = max_ngram_size, K hash heads ((n_max - 1) * H), Dh row width, R table rows (the sum of the heads' primes),
Vo the uncompressed vocabulary (``compress``'s length).

For token ``t`` of document ``s`` (``cu[s] <= t < cu[s + 1]``), with ``c(k)`` the compressed id ``k`` tokens
back (inside the document, else the document's context ``ctx[s]`` right-aligned, else the compressed pad id):

    mix_n   = (c(0) * m[0]) ^ ... ^ (c(n-1) * m[n-1])                      (int64, wrapping)
    row_h   = offsets[h] + mix_n % primes[h]                                (h: the heads of n)
    out[t, h*Dh:(h+1)*Dh] = weight[row_h]

:func:`tokenpos.tables.formulas.ngram_hash.ngram_hash_ids` is the formula (the reference's hashing, bit for bit).
Tokens run in blocks of :data:`BLOCK`: a block's K rows per token are hashed into a (BLOCK, K) scratch, then
copied (the copies' independent reads overlap out of order); no (T, K) index array is ever made. A software
prefetch of the block's rows before the copies measured slower (on a 2-core Xeon guest, B = 16, L = 2048, K = 16,
Dh = 64, after a matmul: 48.6 ms against 37.1 ms without; the plain gather of the same rows 31.5 ms) and is not
done. Blocks run in parallel above :data:`PARALLEL_BYTES` of output, serially below.

Backward: the same hashes give every (token, head)'s row; the gradient slices are summed per unique row (float64
sums, the embedding backward's segment sum) into a row-sparse gradient (unique sorted rows, summed slices).

An id outside [0, Vo) (the layers refuse it first, naming it) is skipped by the kernel (its memory bound, the
token's output is left as it was) and counted; the callers raise ``KernelBoundError`` then.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import njit, prange

from tokenpos.kernels._backward import _group, _segment_sum_core
from tokenpos.kernels._launch import launch
from tokenpos.kernels._threading import parallel, parallel_guard
from tokenpos.kernels.embedding import PREFETCH_AHEAD, PREFETCH_FAR, _unique_ids
from tokenpos.tables.checks.validation import check_token_ids
from tokenpos.tables.errors import KernelBoundError, TokenIdError

BLOCK = 64                  # tokens hashed into a (BLOCK, K) scratch before their rows are copied
CHUNKS_PER_THREAD = 4       # the parallel forward's contiguous runs of blocks per thread
PARALLEL_BYTES = 1 << 18    # smaller outputs run on the calling thread
_NO_CONTEXT = np.zeros((1, 0), np.int64)   # no context: one (1, 0) array for every document (holds nothing)


@njit(inline="always", cache=True)
def fast_mod(x, p, inv):  # pragma: no cover - compiled
    """``x % p`` for int64 ``x`` and ``p`` >= 2, ``inv`` = 1.0 / p (float64): the same value as the integer
    remainder with Python's sign (0 <= r < p), without a 64-bit division (tens of cycles each, K per token).

    Two float64 quotient estimates: the first leaves a remainder of magnitude below about 2**12 + p (float64
    keeps 53 bits of x), the second one within a step of [0, p); the loops make it exact whatever the rounding
    (the int64 products wrap, and the difference x - q * p is exact in two's complement as it fits)."""
    q = np.int64(np.float64(x) * inv)
    r = x - q * p
    q = np.int64(np.float64(r) * inv)
    r = r - q * p
    while r < 0:
        r += p
    while r >= p:
        r -= p
    return r


@njit(inline="always", cache=True)
def _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad, rows):  # pragma: no cover
    """rows[:] = the K table rows of token ``n`` (document ``seg``; ``invs`` = 1 / primes for :func:`fast_mod`);
    returns 1 (rows left partly written) if an id outside [0, Vo) was met, else 0."""
    inside = n - cu[seg]
    C = ctx.shape[1]
    V = compress.shape[0]
    n_max = mult.shape[0]
    H = primes.shape[0] // (n_max - 1)
    mix = np.int64(0)
    for k in range(n_max):
        c = np.int64(pad)
        raw = np.int64(0)
        have = False
        if k <= inside:
            raw = ids[n - k]
            have = True
        elif k - inside <= C:
            raw = ctx[seg, C - (k - inside)]
            have = True
        if have:
            if raw < 0 or raw >= V:
                return 1
            c = compress[raw]
        prod = c * mult[k]
        mix = prod if k == 0 else mix ^ prod
        if k >= 1:
            for j in range(H):
                h = (k - 1) * H + j
                rows[h] = offsets[h] + fast_mod(mix, primes[h], invs[h])
    return 0


@njit(inline="always", cache=True)
def _segment_of(cu, n):  # pragma: no cover - compiled
    """The document of token ``n``: the last s with cu[s] <= n (binary search)."""
    lo, hi = 0, cu.shape[0] - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cu[mid] <= n:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(inline="always", cache=True)
def _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, b, scratch, bad, out):  # pragma: no cover
    """Tokens [b * BLOCK, ...) of the output: hash every row, then copy them; returns the bad count."""
    T = ids.shape[0]
    K = primes.shape[0]
    Dh = weight.shape[1]
    n0 = b * scratch.shape[0]
    n1 = min(T, n0 + scratch.shape[0])
    seg = _segment_of(cu, n0)
    nbad = 0
    for n in range(n0, n1):
        while cu[seg + 1] <= n:
            seg += 1
        bad[n - n0] = _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad,
                                  scratch[n - n0])
        nbad += bad[n - n0]
    for n in range(n0, n1):
        if bad[n - n0]:
            continue
        o = out[n]
        for h in range(K):
            w = weight[scratch[n - n0, h]]
            base = h * Dh
            for d in range(Dh):
                o[base + d] = w[d]
    return nbad


@njit(parallel=True, cache=True)
def forward_core(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, block, chunks,
                 out):  # pragma: no cover - compiled
    """out (T, K * Dh) = the hashed rows of every token; returns the count of tokens with a bad id. The blocks run
    as ``chunks`` contiguous runs (one scratch allocation each)."""
    T = ids.shape[0]
    nb = (T + block - 1) // block
    nchunks = max(1, min(nb, chunks))
    nbad = 0
    for c in prange(nchunks):
        scratch = np.empty((block, primes.shape[0]), np.int64)
        bad = np.empty(block, np.int64)
        for b in range(c * nb // nchunks, (c + 1) * nb // nchunks):
            nbad += _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, b, scratch, bad, out)
    return nbad


@njit(cache=True)
def forward_core_serial(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, block, chunks,
                        out):  # pragma: no cover - compiled
    """:func:`forward_core` on the calling thread (small outputs; forked children of an omp process)."""
    T = ids.shape[0]
    nb = (T + block - 1) // block
    scratch = np.empty((block, primes.shape[0]), np.int64)
    bad = np.empty(block, np.int64)
    nbad = 0
    for b in range(nb):
        nbad += _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, b, scratch, bad, out)
    return nbad


@njit(parallel=True, cache=True)
def rows_core(ids, compress, cu, ctx, mult, primes, invs, offsets, pad, rows):  # pragma: no cover - compiled
    """rows (T, K) = every token's table rows (-1 for a token with a bad id); returns the bad count."""
    T = ids.shape[0]
    nbad = 0
    for n in prange(T):
        seg = _segment_of(cu, n)
        bad = _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad, rows[n])
        if bad:
            rows[n, :] = -1
        nbad += bad
    return nbad


def _args(ids: np.ndarray, cu: np.ndarray | None, ctx: np.ndarray | None) -> tuple[np.ndarray, ...]:
    flat = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if cu is None:                                    # (B, L): B documents of L; (T,): one document
        L = ids.shape[-1] if ids.ndim else 1
        B = flat.shape[0] // L if L else 0
        cu = np.arange(B + 1, dtype=np.int64) * L if L else np.zeros(2, np.int64)
    c = (_NO_CONTEXT if ctx is None or np.size(ctx) == 0      # (S, C)
         else np.ascontiguousarray(ctx, dtype=np.int64).reshape(cu.shape[0] - 1, -1))
    return flat, np.ascontiguousarray(cu, dtype=np.int64), c


def ngram_forward(weight: np.ndarray, ids: np.ndarray, compress: np.ndarray, mult: np.ndarray, primes: np.ndarray,
                  offsets: np.ndarray, pad: int, out: np.ndarray, *, cu_seqlens: np.ndarray | None = None,
                  context: np.ndarray | None = None) -> np.ndarray:
    """out (..., K * Dh) = the hashed rows of ids (...) (a (B, L) batch, or packed (T,) with ``cu_seqlens``
    (S + 1,)); ``context`` (S, C) raw ids before each document. Inputs are checked by the caller (weight (R, Dh)
    float32 / float64 C-contiguous, ids in [0, Vo), compress values in [0, Vc), the settings those of
    ``tables.formulas.ngram_hash``); out C-contiguous of weight's dtype, returned. A bad id met anyway raises
    ``KernelBoundError`` naming it."""
    flat, cu, ctx = _args(ids, cu_seqlens, context)
    T = flat.shape[0]
    if not T:
        return out
    K, Dh = primes.shape[0], weight.shape[1]
    rows = out.reshape(T, K * Dh)
    args = (weight, flat, compress, cu, ctx, mult, primes, 1.0 / primes, offsets, np.int64(pad), BLOCK,
            CHUNKS_PER_THREAD * numba.get_num_threads(), rows)
    if out.nbytes < PARALLEL_BYTES:
        nbad = forward_core_serial(*args)
    else:
        with parallel_guard():
            nbad = parallel(forward_core, forward_core_serial)(*args)
    if nbad:
        raise ngram_bound_error(flat, ctx, compress.shape[0], nbad)
    return out


def ngram_rows(ids: np.ndarray, compress: np.ndarray, mult: np.ndarray, primes: np.ndarray, offsets: np.ndarray,
               pad: int, *, cu_seqlens: np.ndarray | None = None, context: np.ndarray | None = None) -> np.ndarray:
    """(..., K) int64: every token's table rows (the hash ids plus the heads' offsets); checked inputs."""
    flat, cu, ctx = _args(ids, cu_seqlens, context)
    rows = np.empty((flat.shape[0], primes.shape[0]), np.int64)
    if flat.shape[0]:
        with parallel_guard():
            nbad = parallel(rows_core)(flat, compress, cu, ctx, mult, primes, 1.0 / primes, offsets, np.int64(pad),
                                       rows)
        if nbad:
            raise ngram_bound_error(flat, ctx, compress.shape[0], nbad)
    return rows.reshape(*np.shape(ids), primes.shape[0])


def ngram_backward(grad: np.ndarray, ids: np.ndarray, compress: np.ndarray, mult: np.ndarray, primes: np.ndarray,
                   offsets: np.ndarray, pad: int, *, cu_seqlens: np.ndarray | None = None,
                   context: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """grad (..., K * Dh) float32 / float64 -> (unique rows (U,) int64 sorted, summed slices (U, Dh) in grad's
    dtype): ``rows[j]`` is the sum of every (token, head) gradient slice whose table row is ``uniq[j]`` (float64
    sums)."""
    K = primes.shape[0]
    rows = ngram_rows(ids, compress, mult, primes, offsets, pad, cu_seqlens=cu_seqlens, context=context).reshape(-1)
    Dh = grad.shape[-1] // K
    g2 = np.ascontiguousarray(grad).reshape(-1, Dh)                  # (T * K, Dh): slice n*K + h
    uniq, inverse = _unique_ids(rows, -1)
    summed = np.empty((uniq.shape[0], Dh), grad.dtype)
    if summed.size:
        starts, order = _group(inverse, uniq.shape[0], 0)
        with launch(uniq.shape[0], max_chunk=16):
            parallel(_segment_sum_core)(g2, order, starts, np.uint64(0), np.uint64(0), np.uint64(0), 1.0,
                                        PREFETCH_AHEAD, PREFETCH_FAR, summed)
    return uniq, summed


def ngram_bound_error(flat: np.ndarray, ctx: np.ndarray, vocab: int, skipped: Any) -> KernelBoundError:
    """The error of a lookup that met an id outside [0, Vo): the shared check's text for the first one, then what
    the kernel did. The error path only."""
    what = "an id outside compress's domain"
    try:
        check_token_ids(flat, vocab)
        check_token_ids(ctx, vocab)
    except TokenIdError as err:
        what = str(err)
    return KernelBoundError(f"{what}: the n-gram kernel skipped {skipped} tokens (tokenpos layers name the first "
                            f"bad id at their entry)")
