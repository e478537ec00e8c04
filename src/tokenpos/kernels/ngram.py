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
copied (the copies' independent reads overlap out of order); no (T, K) index array is ever made. Per token the
n - 1 mixes come first, then each n's H remainders in a loop of their own (:func:`fast_mod`, branch-free, so that
loop runs as vectors). While a block is copied, the ``compress`` entry of every next-block token is prefetched
into L2: that lookup (a random read of a Vo-entry table which the copies evict from the caches) was most of the
hashing's cost. Blocks run in parallel above :data:`PARALLEL_BYTES` of output, serially below.

Measured (2-core Xeon guest, K = 16, Dh = 64, 512 MiB table; the serial cores by thread time against a serial
gather of the same rows, B = 8, L = 2048, best of 30-40 under load): the hashing is not overlapped with the copies,
so its cost adds to the gather's. The old loop (a branching remainder per head inside the mix loop) ran 0.76-0.78x
the gather; the split loop 0.85-0.87x; with the prefetch of ``compress`` 0.92-0.95x. Not kept: hashing a token a
few tokens ahead inside the copy loop (a ring of rows instead of blocks), 0.61-0.64x with or without a prefetch of
the hashed rows into L1 or L2; block sizes 16 and 256 (as 64). A prefetch of the block's table rows before the
copies measured slower before (B = 16, L = 2048, after a matmul: 48.6 ms against 37.1 ms without; the plain
gather 31.5 ms). In model conditions (``benchmarks/ngram_bench.py``, quiet, each call after a matmul) the
parallel forward went from 0.67-0.77x the random-gather limit to 0.92-0.96x (best; 0.88-0.92 median) at B = 16,
L = 2048 and 0.86-0.93x at B = 4, L = 1024.

A shard (``row_start``; the vocab-parallel layer): weight (Rw, Dh) holds the table's rows [row_start,
row_start + Rw); a hashed row outside them is written as a zero slice, the table unread (one compare per row in the
copy loop), and the backward (``num_rows``) sums only the shard's rows, numbered from its first.

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
from tokenpos.kernels._prefetch import prefetch_line_l2
from tokenpos.kernels._threading import parallel, parallel_guard
from tokenpos.kernels.embedding import PREFETCH_AHEAD, PREFETCH_FAR, _unique_ids
from tokenpos.tables.checks.validation import check_token_ids
from tokenpos.tables.errors import ConfigError, KernelBoundError, TokenIdError

BLOCK = 64                  # tokens hashed into a (BLOCK, K) scratch before their rows are copied
CHUNKS_PER_THREAD = 4       # the parallel forward's contiguous runs of blocks per thread
PARALLEL_BYTES = 1 << 18    # smaller outputs run on the calling thread
PRIME_LIMIT = 1 << 51       # fast_mod is exact below it (a table of that many rows cannot be allocated)
_NO_CONTEXT = np.zeros((1, 0), np.int64)   # no context: one (1, 0) array for every document (holds nothing)


@njit(inline="always", cache=True)
def fast_mod(x, p, inv):  # pragma: no cover - compiled
    """``x % p`` for int64 ``x`` and ``2 <= p < PRIME_LIMIT``, ``inv`` = 1.0 / p (float64): the same value as the
    integer remainder with Python's sign (0 <= r < p), without a 64-bit division (tens of cycles each, K per
    token) and without a branch (the heads' loop runs as vectors).

    Two float64 quotient estimates. The first (float64 keeps 53 bits of x; three roundings, each within 2**-53)
    leaves ``r = x - q * p`` with |r| <= p + 2**63 * 3.3 * 2**-53 < p + 2**12: exact in float64 while that is
    below 2**53, which :data:`PRIME_LIMIT` keeps; the int64 products wrap, and the difference is exact in two's
    complement as it fits. The second estimate is then within (|r| / p) * 2.3 * 2**-53 of r / p, so the
    truncated quotient leaves |r| <= p (an integer below p + 1): one conditional add of p and one conditional
    subtract of p, as masks, end in [0, p)."""
    q = np.int64(np.float64(x) * inv)
    r = x - q * p
    q = np.int64(np.float64(r) * inv)
    r = r - q * p                                   # in [-p, p]
    r = r + (p & (r >> 63))                         # in [0, p]
    return r - (p & ((p - 1 - r) >> 63))            # in [0, p)


@njit(inline="always", cache=True)
def _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad, rows, mixes):  # pragma: no cover
    """rows[:] = the K table rows of token ``n`` (document ``seg``; ``invs`` = 1 / primes for :func:`fast_mod`);
    returns 1 if an id outside [0, Vo) was met (its rows then hash the pad in its place: to be discarded), else 0.

    The n_max - 1 mixes first, into the scratch ``mixes`` (n_max,), then each n's H heads in a loop of their own.
    Returning at a bad id, instead of going on with the pad, made the forward 0.81-0.83x the gather against
    0.92-0.95x (serial, B = 8, L = 2048, with the mixes in ``rows`` or in this scratch; the scratch alone was not
    measured apart)."""
    inside = n - cu[seg]
    C = ctx.shape[1]
    V = compress.shape[0]
    n_max = mult.shape[0]
    H = primes.shape[0] // (n_max - 1)
    mix = np.int64(0)
    bad = 0
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
                bad = 1                             # c stays the pad's: nothing is read outside compress
            else:
                c = compress[raw]
        prod = c * mult[k]
        mix = prod if k == 0 else mix ^ prod
        if k >= 1:
            mixes[k - 1] = mix
    for g in range(n_max - 1):
        m = mixes[g]
        b = g * H
        for j in range(H):
            rows[b + j] = offsets[b + j] + fast_mod(m, primes[b + j], invs[b + j])
    return bad


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
def _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, start, b, scratch, bad, mixes,
           out):  # pragma: no cover
    """Tokens [b * BLOCK, ...) of the output: hash every row, then copy them (prefetching the next block's
    ``compress`` entries); a row outside [start, start + Rw) (weight (Rw, Dh) holds those) is written as zeros,
    the table unread. Returns the bad count."""
    T = ids.shape[0]
    K = primes.shape[0]
    Rw, Dh = weight.shape
    n0 = b * scratch.shape[0]
    n1 = min(T, n0 + scratch.shape[0])
    seg = _segment_of(cu, n0)
    nbad = 0
    for n in range(n0, n1):
        while cu[seg + 1] <= n:
            seg += 1
        bad[n - n0] = _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad,
                                  scratch[n - n0], mixes)
        nbad += bad[n - n0]
    V = compress.shape[0]
    for n in range(n0, n1):
        q = n + scratch.shape[0]                    # the next block's token: its compressed id into L2
        if q < T and 0 <= ids[q] < V:
            prefetch_line_l2(compress, ids[q])
        if bad[n - n0]:
            continue
        o = out[n]
        for h in range(K):
            r = scratch[n - n0, h] - start
            base = h * Dh
            if r < 0 or r >= Rw:                        # another shard's row: zeros, nothing read
                for d in range(Dh):
                    o[base + d] = 0.0
                continue
            w = weight[r]
            for d in range(Dh):
                o[base + d] = w[d]
    return nbad


@njit(parallel=True, cache=True)
def forward_core(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, start, block, chunks,
                 out):  # pragma: no cover - compiled
    """out (T, K * Dh) = the hashed rows of every token (weight (Rw, Dh) holds rows [start, start + Rw); zeros for
    the others); returns the count of tokens with a bad id. The blocks run as ``chunks`` contiguous runs (one scratch
    allocation each)."""
    T = ids.shape[0]
    nb = (T + block - 1) // block
    nchunks = max(1, min(nb, chunks))
    nbad = 0
    for c in prange(nchunks):
        scratch = np.empty((block, primes.shape[0]), np.int64)
        bad = np.empty(block, np.int64)
        mixes = np.empty(mult.shape[0], np.int64)
        for b in range(c * nb // nchunks, (c + 1) * nb // nchunks):
            nbad += _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, start, b, scratch, bad,
                           mixes, out)
    return nbad


@njit(cache=True)
def forward_core_serial(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, start, block, chunks,
                        out):  # pragma: no cover - compiled
    """:func:`forward_core` on the calling thread (small outputs; forked children of an omp process)."""
    T = ids.shape[0]
    nb = (T + block - 1) // block
    scratch = np.empty((block, primes.shape[0]), np.int64)
    bad = np.empty(block, np.int64)
    mixes = np.empty(mult.shape[0], np.int64)
    nbad = 0
    for b in range(nb):
        nbad += _block(weight, ids, compress, cu, ctx, mult, primes, invs, offsets, pad, start, b, scratch, bad, mixes,
                       out)
    return nbad


@njit(cache=True)
def _rows_run(ids, compress, cu, ctx, mult, primes, invs, offsets, pad, n0, n1, rows):  # pragma: no cover - compiled
    """rows[n0:n1] of :func:`rows_core` (one scratch for the run); returns the run's bad count."""
    mixes = np.empty(mult.shape[0], np.int64)
    seg = _segment_of(cu, n0)
    nbad = 0
    for n in range(n0, n1):
        while cu[seg + 1] <= n:
            seg += 1
        bad = _hash_token(ids, compress, cu, ctx, seg, n, mult, primes, invs, offsets, pad, rows[n], mixes)
        if bad:
            rows[n, :] = -1
        nbad += bad
    return nbad


@njit(parallel=True, cache=True)
def rows_core(ids, compress, cu, ctx, mult, primes, invs, offsets, pad, chunks, rows):  # pragma: no cover - compiled
    """rows (T, K) = every token's table rows (-1 for a token with a bad id), in ``chunks`` contiguous runs;
    returns the bad count."""
    T = ids.shape[0]
    nchunks = max(1, min(T, chunks))
    nbad = 0
    for c in prange(nchunks):
        nbad += _rows_run(ids, compress, cu, ctx, mult, primes, invs, offsets, pad, c * T // nchunks,
                          (c + 1) * T // nchunks, rows)
    return nbad


def _args(ids: np.ndarray, cu: np.ndarray | None, ctx: np.ndarray | None,
          primes: np.ndarray) -> tuple[np.ndarray, ...]:
    if primes.shape[0] and int(primes.max()) >= PRIME_LIMIT:
        raise ConfigError(f"the n-gram kernel takes head primes below 2**51 (its division-free remainder is exact "
                          f"there), got {int(primes.max())}")
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
                  context: np.ndarray | None = None, row_start: int = 0) -> np.ndarray:
    """out (..., K * Dh) = the hashed rows of ids (...) (a (B, L) batch, or packed (T,) with ``cu_seqlens``
    (S + 1,)); ``context`` (S, C) raw ids before each document. Inputs are checked by the caller (weight (Rw, Dh)
    float32 / float64 C-contiguous, ids in [0, Vo), compress values in [0, Vc), the settings those of
    ``tables.formulas.ngram_hash``); out C-contiguous of weight's dtype, returned. A bad id met anyway raises
    ``KernelBoundError`` naming it.

    ``weight`` holds the table's rows [row_start, row_start + Rw) (the whole (R, Dh) table at the default 0; a
    shard of a row-split table otherwise): a hashed row outside them is a zero slice of ``out``, written without
    reading the table (the vocab-parallel layer's part of the lookup; summed over the shards, each slice comes
    from one of them)."""
    flat, cu, ctx = _args(ids, cu_seqlens, context, primes)
    T = flat.shape[0]
    if not T:
        return out
    K, Dh = primes.shape[0], weight.shape[1]
    rows = out.reshape(T, K * Dh)
    args = (weight, flat, compress, cu, ctx, mult, primes, 1.0 / primes, offsets, np.int64(pad), np.int64(row_start),
            BLOCK, CHUNKS_PER_THREAD * numba.get_num_threads(), rows)
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
    flat, cu, ctx = _args(ids, cu_seqlens, context, primes)
    rows = np.empty((flat.shape[0], primes.shape[0]), np.int64)
    if flat.shape[0]:
        with parallel_guard():
            nbad = parallel(rows_core)(flat, compress, cu, ctx, mult, primes, 1.0 / primes, offsets, np.int64(pad),
                                       CHUNKS_PER_THREAD * numba.get_num_threads(), rows)
        if nbad:
            raise ngram_bound_error(flat, ctx, compress.shape[0], nbad)
    return rows.reshape(*np.shape(ids), primes.shape[0])


def ngram_backward(grad: np.ndarray, ids: np.ndarray, compress: np.ndarray, mult: np.ndarray, primes: np.ndarray,
                   offsets: np.ndarray, pad: int, *, cu_seqlens: np.ndarray | None = None,
                   context: np.ndarray | None = None, row_start: int = 0,
                   num_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """grad (..., K * Dh) float32 / float64 -> (unique rows (U,) int64 sorted, summed slices (U, Dh) in grad's
    dtype): ``rows[j]`` is the sum of every (token, head) gradient slice whose table row is ``uniq[j]`` (float64
    sums). With ``num_rows``, the gradient of a shard holding rows [row_start, row_start + num_rows) (as
    :func:`ngram_forward`'s ``row_start``): only those rows, numbered from the shard's first (``uniq`` in
    [0, num_rows)); each row's slices summed in the same order as without the range."""
    K = primes.shape[0]
    rows = ngram_rows(ids, compress, mult, primes, offsets, pad, cu_seqlens=cu_seqlens, context=context).reshape(-1)
    skip = -1
    if num_rows is not None:                                         # a shard: its rows, the others left out
        skip = int(num_rows)
        _localize(rows, np.int64(row_start), np.int64(skip))
    Dh = grad.shape[-1] // K
    g2 = np.ascontiguousarray(grad).reshape(-1, Dh)                  # (T * K, Dh): slice n*K + h
    uniq, inverse = _unique_ids(rows, skip)
    summed = np.empty((uniq.shape[0], Dh), grad.dtype)
    if summed.size:
        starts, order = _group(inverse, uniq.shape[0], 0)
        with launch(uniq.shape[0], max_chunk=16):
            parallel(_segment_sum_core)(g2, order, starts, np.uint64(0), np.uint64(0), np.uint64(0), 1.0,
                                        PREFETCH_AHEAD, PREFETCH_FAR, summed)
    return uniq, summed


@njit(cache=True)
def _localize(rows, start, n):  # pragma: no cover - compiled
    """In place: rows (N,) of the whole table -> rows of the shard [start, start + n), n (left out by the segment
    sum as its padding id) for every other row."""
    for i in range(rows.shape[0]):
        r = rows[i] - start
        rows[i] = r if 0 <= r < n else n


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
