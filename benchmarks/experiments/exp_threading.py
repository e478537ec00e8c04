"""Experiment: the numba threading layer's cost, one process per layer, alternated over rounds.

Usage: python benchmarks/experiments/exp_threading.py [--rounds N] [--reps N] [--quick]

Each child process sets ``NUMBA_THREADING_LAYER`` (tbb: left unset, tokenpos's own choice; omp;
workqueue), times the forward kernel (``tokenpos.kernels.embedding_forward(..., out=)``, with and
without dropout) interleaved with ``torch.index_select`` (the gather limit, which does not use
numba) and prints kernel/gather ratios, best and median, so the load of a shared machine cancels
out as far as it can. The layer is fixed per process, so layers cannot be interleaved within one.
A layer that cannot load here (omp without an OpenMP runtime) is reported and skipped.

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
import numpy as np, torch, numba
import tokenpos.kernels as K
reps, V, D, B, L = (int(a) for a in sys.argv[1:6])
rng = np.random.default_rng(0)
w = rng.standard_normal((V, D), dtype=np.float32)
pt = rng.standard_normal((L, D), dtype=np.float32)
batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
out = np.empty((B, L, D), np.float32)
wt, tout = torch.from_numpy(w), torch.from_numpy(out).view(B * L, D)
tb = [torch.from_numpy(b.reshape(-1)) for b in batches]
it = [0]
def nxt():
    it[0] += 1
    return it[0] % 4
def kern(p):
    return lambda: K.embedding_forward(w, batches[nxt()], scale=27.7, pos_table=pt, pos_ids=np.arange(L),
                                       dropout_p=p, seed=1, out=out)
impls = {"gather": lambda: torch.index_select(wt, 0, tb[nxt()], out=tout), "forward": kern(0.0),
         "dropout": kern(0.1)}
for f in impls.values():
    f()
times = {k: [] for k in impls}
order = np.random.default_rng(0)
for _ in range(reps):
    for k in order.permutation(list(impls)):
        t0 = time.perf_counter(); impls[k](); times[k].append(time.perf_counter() - t0)
g = times["gather"]
res = {"layer": numba.threading_layer()}
for k in ("forward", "dropout"):
    res[k] = (min(g) / min(times[k]), float(np.median(g) / np.median(times[k])))
print(json.dumps(res))
"""

FULL = (50257, 768, 16, 512)      # V, D, B, L: the bench's forward
QUICK = (4096, 256, 4, 64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="processes per layer, alternated (default 3)")
    ap.add_argument("--reps", type=int, default=40, help="interleaved reps in each process (default 40)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny shapes, one round of 3 reps: checks that it runs, numbers mean nothing")
    args = ap.parse_args(argv)
    shape = QUICK if args.quick else FULL
    rounds, reps = (1, 3) if args.quick else (args.rounds, args.reps)
    results: dict[str, list] = {}
    for _ in range(rounds):
        for layer in ("tbb", "omp", "workqueue"):
            env = {**os.environ, "NUMBA_THREADING_LAYER": layer}
            if layer == "tbb":
                env.pop("NUMBA_THREADING_LAYER")             # tokenpos's own choice
            done = subprocess.run([sys.executable, "-c", CHILD, str(reps), *map(str, shape)], capture_output=True,
                                  text=True, env=env, timeout=600)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(f"{layer:10s} did not run here: {tail}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            results.setdefault(r["layer"], []).append(r)
    for layer, rs in results.items():
        for case in ("forward", "dropout"):
            best = max(r[case][0] for r in rs)
            meds = sorted(r[case][1] for r in rs)
            print(f"{layer:10s} {case:8s} x gather: best {best:.2f}, median of process medians "
                  f"{meds[len(meds) // 2]:.2f} ({len(rs)} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
