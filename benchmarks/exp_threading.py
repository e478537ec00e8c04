"""Experiment: the numba threading layer's cost, one process per layer, alternated over rounds.

Each process times the forward kernel (out=, 2 threads) interleaved with torch.index_select (the
gather limit, which does not use numba) and prints kernel/gather ratios, best and median, so the
load of a shared machine cancels out as far as it can. The layer is fixed per process, so layers
cannot be interleaved within one.

Usage: python benchmarks/exp_threading.py [rounds] [reps]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np, torch, numba
import tokenpos.kernels as K
V, D, B, L = 50257, 768, 16, 512
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
for _ in range(int(sys.argv[1])):
    for k in order.permutation(list(impls)):
        t0 = time.perf_counter(); impls[k](); times[k].append(time.perf_counter() - t0)
g = times["gather"]
res = {"layer": numba.threading_layer()}
for k in ("forward", "dropout"):
    res[k] = (min(g) / min(times[k]), float(np.median(g) / np.median(times[k])))
print(json.dumps(res))
"""


def main(rounds: int, reps: int) -> None:
    env0 = {**os.environ}
    results: dict[str, list] = {}
    for _ in range(rounds):
        for layer in ("tbb", "omp", "workqueue"):
            env = {**env0, "NUMBA_THREADING_LAYER": layer}
            if layer == "tbb":
                env.pop("NUMBA_THREADING_LAYER")             # tokenpos's own choice
            out = subprocess.run([sys.executable, "-c", CHILD, str(reps)], capture_output=True, text=True,
                                 env=env, timeout=600)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault(r["layer"], []).append(r)
    for layer, rs in results.items():
        for case in ("forward", "dropout"):
            best = max(r[case][0] for r in rs)
            meds = sorted(r[case][1] for r in rs)
            print(f"{layer:10s} {case:8s} x gather: best {best:.2f}, median of process medians "
                  f"{meds[len(meds) // 2]:.2f} ({len(rs)} processes)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, int(sys.argv[2]) if len(sys.argv) > 2 else 40)
