"""Experiment: each piece of the embedding forward kernel, interleaved in one process (ratios).

Usage: python benchmarks/exp_forward.py [reps]    (the issue's workload; prints best/median ratios)
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from numba import njit, prange

import tokenpos.kernels.embedding as E
from tokenpos.kernels._launch import launch
from tokenpos.kernels._rng import dropout_params


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
    key, thr, inv = dropout_params(0, 0.0)
    tile = max(1, E.FORWARD_TILE_BYTES // (D * 4))
    N = B * L
    it = [0]

    def ids():
        it[0] += 1
        return batches[it[0] % 4]

    def tids():
        it[0] += 1
        return tb[it[0] % 4]

    def cur(ahead, far, tile_, use_launch):
        def f():
            args = (w, ids(), s, pt, pid, True, key, thr, np.float32(inv), np.uint64(0), ahead, far, tile_, out)
            if use_launch:
                with launch(-(-N // tile_), 2 * N * D * 4, max_chunk=2):
                    E._forward_core(*args)
            else:
                E._forward_core(*args)
        return f

    impls = {
        "copy": lambda: dst.copy_(src),
        "gather torch index_select": lambda: torch.index_select(wt, 0, tids(), out=tout),
        "gather numba plain": lambda: gather(w, ids(), out),
        "plain loop": lambda: plain(w, ids(), s, pt, pid, out),
        "plain rows (views)": lambda: plain_rows(w, ids(), s, pt, pid, out),
        "plain rows fastmath": lambda: plain_fm(w, ids(), s, pt, pid, out),
        "plain loop + in-loop check": lambda: plain_check(w, ids(), s, pt, pid, out),
        "plain loop, out=np.empty": lambda: plain(w, ids(), s, pt, pid, np.empty_like(out)),
        "current public kernel out=": lambda: E.embedding_forward(w, ids().reshape(B, L), scale=float(s), pos_table=pt,
                                                                  pos_ids=pid, out=out.reshape(B, L, D)),
        "current core (prefetch, tiles, launch)": cur(2, 16, tile, True),
        "core no prefetch, tiles, launch": cur(0, 0, tile, True),
        "core no prefetch, tile=1, no launch": cur(0, 0, 1, False),
        "core prefetch, tiles, no launch": cur(2, 16, tile, False),
        "separate id check pass": lambda: ((ids() < 0) | (ids() >= V)).any(),
    }
    for f in impls.values():
        f()
    times = {k: [] for k in impls}
    order_rng = np.random.default_rng(1)
    names = list(impls)
    for _ in range(reps):
        for k in order_rng.permutation(names):
            t0 = time.perf_counter()
            impls[k]()
            times[k].append(time.perf_counter() - t0)
    g = "gather torch index_select"
    gb, gm = min(times[g]), np.median(times[g])
    cb, cm = min(times["copy"]), np.median(times["copy"])
    print(f"{'impl':42s} {'best ms':>8s} {'med ms':>8s} {'xgather b':>9s} {'xgather m':>9s} {'xcopy b':>8s}")
    for k, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{k:42s} {b*1e3:8.2f} {m*1e3:8.2f} {gb/b:9.2f} {gm/m:9.2f} {cb/b:8.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
