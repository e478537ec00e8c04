"""Experiment: each piece of the embedding forward kernel, interleaved in one process (ratios).

Usage: python benchmarks/exp_forward.py [reps]    (the issue's workload; prints best/median ratios)

TOKENPOS_EXP_CPU=1 times process CPU seconds instead of wall seconds (with NUMBA_NUM_THREADS=1 and
one torch thread: a measure of work per call that a loaded machine disturbs much less).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
from numba import njit, prange

CPU_TIME = os.environ.get("TOKENPOS_EXP_CPU") == "1"
if CPU_TIME:
    torch.set_num_threads(1)

import tokenpos.kernels.embedding as E  # noqa: E402 - after the thread setting


@njit(parallel=True, cache=True)
def plain(w, ids, s, pos, pid, out):  # pragma: no cover
    N = ids.shape[0]
    D = w.shape[1]
    Lp = pid.shape[0]
    for n in prange(N):
        r = ids[n]
        p = pid[n % Lp]
        for d in range(D):
            out[n, d] = w[r, d] * s + pos[p, d]


@njit(parallel=True, cache=True)
def plain_check(w, ids, s, pos, pid, out):  # pragma: no cover
    N = ids.shape[0]
    V = w.shape[0]
    D = w.shape[1]
    Lp = pid.shape[0]
    bad = 0
    for n in prange(N):
        r = ids[n]
        if r < 0 or r >= V:
            bad += 1
            continue
        p = pid[n % Lp]
        for d in range(D):
            out[n, d] = w[r, d] * s + pos[p, d]
    return bad


@njit(parallel=True, cache=True)
def plain_rows(w, ids, s, pos, pid, out):  # pragma: no cover
    N = ids.shape[0]
    D = w.shape[1]
    Lp = pid.shape[0]
    for n in prange(N):
        wr = w[ids[n]]
        pr = pos[pid[n % Lp]]
        o = out[n]
        for d in range(D):
            o[d] = wr[d] * s + pr[d]


@njit(parallel=True, cache=True, fastmath=True)
def plain_fm(w, ids, s, pos, pid, out):  # pragma: no cover
    N = ids.shape[0]
    D = w.shape[1]
    Lp = pid.shape[0]
    for n in prange(N):
        wr = w[ids[n]]
        pr = pos[pid[n % Lp]]
        o = out[n]
        for d in range(D):
            o[d] = wr[d] * s + pr[d]


@njit(parallel=True, cache=True)
def gather(w, ids, out):  # pragma: no cover
    N = ids.shape[0]
    D = w.shape[1]
    for n in prange(N):
        r = ids[n]
        for d in range(D):
            out[n, d] = w[r, d]


def main(reps: int) -> None:
    V, D, B, L = 50257, 768, 16, 512
    rng = np.random.default_rng(0)
    w = rng.standard_normal((V, D), dtype=np.float32) * 0.02
    pt = rng.standard_normal((L, D), dtype=np.float32) * 0.02
    batches = [rng.integers(0, V, B * L) for _ in range(4)]
    pid = np.arange(L)
    s = np.float32(np.sqrt(D))
    out = np.empty((B * L, D), np.float32)
    wt = torch.from_numpy(w)
    tb = [torch.from_numpy(b) for b in batches]
    tout = torch.from_numpy(out)
    src = torch.randn(B * L * D)
    dst = torch.empty_like(src)
    it = [0]

    def ids():
        it[0] += 1
        return batches[it[0] % 4]

    def tids():
        it[0] += 1
        return tb[it[0] % 4]

    def kern(check, stream, out_=None, p=0.0):
        def f():
            E.STREAM_BYTES = 0 if stream else 1 << 62
            E.embedding_forward(w, ids().reshape(B, L), scale=float(s), pos_table=pt, pos_ids=pid, dropout_p=p,
                                seed=1, out=out.reshape(B, L, D) if out_ is None else out_, check=check)
        return f

    aligned = np.empty(B * L * D + 16, np.float32)
    k = ((-aligned.ctypes.data) % 64) // 4
    aligned = aligned[k:k + B * L * D].reshape(B, L, D)
    from tokenpos.kernels._forward import forward_core
    from tokenpos.kernels._rng import dropout_params
    bits, thr, inv = dropout_params(1, 0.0)

    def core(check, stream, rows):
        return lambda: forward_core(w, ids(), s, pt, pid, True, bits, thr, np.float32(inv), np.uint64(0), check, stream,
                                    np.uint64(out.ctypes.data), rows, *E.prefetch_rows(D * 4), out)

    impls = {
        "core check stream rows=21": core(True, True, 21),
        "core check nostream rows=21": core(True, False, 21),
        "core nocheck nostream rows=21": core(False, False, 21),
        "core nocheck nostream rows=1": core(False, False, 1),
        "plain loop + in-loop check": lambda: plain_check(w, ids(), s, pt, pid, out),
        "copy": lambda: dst.copy_(src),
        "gather torch index_select": lambda: torch.index_select(wt, 0, tids(), out=tout),
        "gather numba plain": lambda: gather(w, ids(), out),
        "plain loop (issue's 8 lines)": lambda: plain(w, ids(), s, pt, pid, out),
        "kernel check=True stream": kern(True, True),
        "kernel check=True stream, 64B-aligned out": kern(True, True, aligned),
        "kernel check=False stream": kern(False, True),
        "kernel check=True no stream": kern(True, False),
        "kernel out=None (np.empty) stream": kern(True, True, None) if False else
            (lambda: E.embedding_forward(w, ids().reshape(B, L), scale=float(s), pos_table=pt, pos_ids=pid)),
        "kernel dropout 0.1 stream": kern(True, True, p=0.1),
        "kernel dropout 0.1 no stream": kern(True, False, p=0.1),
    }
    for f in impls.values():
        f()
    times = {k: [] for k in impls}
    order_rng = np.random.default_rng(1)
    names = list(impls)
    clock = time.process_time if CPU_TIME else time.perf_counter
    for _ in range(reps):
        for k in order_rng.permutation(names):
            t0 = clock()
            impls[k]()
            times[k].append(clock() - t0)
    g = "gather torch index_select"
    gb, gm = min(times[g]), np.median(times[g])
    cb = min(times["copy"])
    print(f"{'impl':42s} {'best ms':>8s} {'med ms':>8s} {'xgather b':>9s} {'xgather m':>9s} {'xcopy b':>8s}")
    for k, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{k:42s} {b*1e3:8.2f} {m*1e3:8.2f} {gb/b:9.2f} {gm/m:9.2f} {cb/b:8.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
