"""Experiment: the numba threading layer in model conditions (each timed call right after a torch matmul).

Usage: python benchmarks/experiments/exp_pool.py [--rounds N] [--reps N] [--quick]

One child process per configuration, alternated over rounds (the layer is fixed per process):
``tbb`` (tokenpos's choice until issue 29), ``omp`` (numba's OpenMP layer; torch is imported first,
so its ``GOMP_parallel`` binds to torch's own libgomp and the kernels run on torch's intra-op
threads: tokenpos's choice since issue 29 when torch is loaded),
and each with ``OMP_WAIT_POLICY=PASSIVE`` (the README's old advice). In each child every timed
call follows a ~1 GFLOP torch matmul of the model dim (torch's OpenMP threads then spin, as
between a model's layers), default OpenMP policy unless named; the references (the gather
``index_select`` and ``copy_``) are timed the same way, interleaved. Printed: kernel / reference
ratios, best and median, per configuration (medians over the processes).

Public APIs only: :mod:`tokenpos.kernels`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np, torch
import tokenpos.kernels as K
import numba
from tokenpos.kernels import _threading
if sys.argv[10] == "tbb":                  # tokenpos's choice without torch: TBB, loaded by path
    assert _threading._load_tbb()
    numba.config.THREADING_LAYER = "tbb"   # before the first launch fixes the layer
reps, V, D, B, L, rB, rH, rL, Dh = (int(a) for a in sys.argv[1:10])
rng = np.random.default_rng(0)
w = rng.standard_normal((V, D), dtype=np.float32)
pt = rng.standard_normal((L, D), dtype=np.float32)
batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
out = np.empty((B, L, D), np.float32)
wt, tout = torch.from_numpy(w), torch.from_numpy(out).view(B * L, D)
tb = [torch.from_numpy(b.reshape(-1)) for b in batches]
q, k = (rng.standard_normal((rB, rH, rL, Dh), dtype=np.float32) for _ in range(2))
oq, ok = np.empty_like(q), np.empty_like(k)
ang = np.arange(rL)[:, None] * 10000.0 ** (-np.arange(0, Dh, 2) / Dh)
c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
src, dst = torch.randn(2 * q.size), torch.empty(2 * q.size)
def mm(Dm):
    m = max(16, (1 << 29) // (Dm * Dm))
    a, b, o = torch.randn(m, Dm), torch.randn(Dm, Dm), torch.empty(m, Dm)
    return lambda: torch.mm(a, b, out=o)
mm_e, mm_r = mm(D), mm(rH * Dh)
it = [0]
def nxt():
    it[0] += 1
    return it[0] % 4
impls = {
    "gather": (mm_e, lambda: torch.index_select(wt, 0, tb[nxt()], out=tout)),
    "forward": (mm_e, lambda: K.embedding_forward(w, batches[nxt()], scale=27.7, pos_table=pt,
                                                  pos_ids=np.arange(L), out=out)),
    "dropout": (mm_e, lambda: K.embedding_forward(w, batches[nxt()], scale=27.7, pos_table=pt,
                                                  pos_ids=np.arange(L), dropout_p=0.1, seed=nxt() + 1, out=out)),
    "copy": (mm_r, lambda: dst.copy_(src)),
    "rope": (mm_r, lambda: K.rope_apply(q, k, c, s, out_q=oq, out_k=ok)),
}
for pre, f in impls.values():
    pre(); f()
times = {n: [] for n in impls}
order = np.random.default_rng(0)
for _ in range(reps):
    for n in order.permutation(list(impls)):
        pre, f = impls[n]
        pre()
        t0 = time.perf_counter(); f(); times[n].append(time.perf_counter() - t0)
res = {"layer": numba.threading_layer()}
for n, ref in (("forward", "gather"), ("dropout", "gather"), ("rope", "copy")):
    res[n] = (min(times[ref]) / min(times[n]), float(np.median(times[ref]) / np.median(times[n])))
    res[n + "_ms"] = float(np.median(times[n]) * 1e3)
print(json.dumps(res))
"""

FULL = (50257, 768, 16, 512, 2, 32, 2048, 128)      # V, D, B, L; RoPE B, H, L, Dh (134 MB of q and k)
QUICK = (4096, 256, 4, 64, 1, 2, 64, 32)
CONFIGS = {"tbb": ("tbb", {}), "omp": ("omp", {}),           # (layer, extra environment)
           "tbb, OMP_WAIT_POLICY=PASSIVE": ("tbb", {"OMP_WAIT_POLICY": "PASSIVE"}),
           "omp, OMP_WAIT_POLICY=PASSIVE": ("omp", {"OMP_WAIT_POLICY": "PASSIVE"})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="processes per configuration, alternated (default 3)")
    ap.add_argument("--reps", type=int, default=15, help="interleaved reps in each process (default 15)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one round of 3 reps (numbers mean nothing)")
    args = ap.parse_args(argv)
    shape = QUICK if args.quick else FULL
    rounds, reps = (1, 3) if args.quick else (args.rounds, args.reps)
    results: dict[str, list] = {}
    for _ in range(rounds):
        for name, (layer, extra) in CONFIGS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY")}
            done = subprocess.run([sys.executable, "-c", CHILD, str(reps), *map(str, shape), layer],
                                  capture_output=True, text=True, env={**env, **extra}, timeout=900)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(f"{name}: did not run here: {tail}")
                continue
            results.setdefault(name, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, rs in results.items():
        for case in ("forward", "dropout", "rope"):
            best = sorted(r[case][0] for r in rs)[len(rs) // 2]
            med = sorted(r[case][1] for r in rs)[len(rs) // 2]
            ms = sorted(r[case + "_ms"] for r in rs)[len(rs) // 2]
            print(f"{name:30s} {case:8s} x reference: best {best:.2f}, median {med:.2f} "
                  f"(kernel median {ms:.2f} ms; medians over {len(rs)} processes, layer {rs[0]['layer']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
