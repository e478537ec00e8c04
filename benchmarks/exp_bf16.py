"""Experiment: the fused bf16 forward vs the bf16 gather limits and torch (eager, compile), interleaved.

Usage: TOKENPOS_EXP_CPU=1 NUMBA_NUM_THREADS=1 python benchmarks/exp_bf16.py [reps]
(TOKENPOS_EXP_CPU=1: process CPU seconds with one thread, robust on a loaded machine.)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

CPU_TIME = os.environ.get("TOKENPOS_EXP_CPU") == "1"
if CPU_TIME:
    torch.set_num_threads(1)

import tokenpos.kernels as K  # noqa: E402 - after the thread setting
from tokenpos.analysis.bench_cases import gather_rows  # noqa: E402


def main(reps: int) -> None:
    V, D, B, L = 50257, 768, 16, 512
    rng = np.random.default_rng(0)
    W = torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32) * 0.02).bfloat16()
    P = torch.from_numpy(rng.standard_normal((L, D), dtype=np.float32) * 0.02).bfloat16()
    w, pt = W.view(torch.int16).numpy().view(np.uint16), P.view(torch.int16).numpy().view(np.uint16)
    batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
    tb = [torch.from_numpy(b) for b in batches]
    out_t = torch.empty(B, L, D, dtype=torch.bfloat16)
    out = out_t.view(torch.int16).numpy().view(np.uint16)
    s = float(np.sqrt(D))
    pos, tp = np.arange(L), torch.arange(L)
    it = [0]

    def nxt() -> int:
        it[0] += 1
        return it[0] % 4

    def formula(ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, W) * s + P[tp]

    compiled = torch.compile(formula)
    with torch.no_grad():
        impls = {
            "gather bf16: torch.index_select(out=)": lambda: torch.index_select(W, 0, tb[nxt()].reshape(-1),
                                                                                out=out_t.view(B * L, D)),
            "gather bf16: plain numba": lambda: gather_rows(w, batches[nxt()].reshape(-1), out.reshape(B * L, D)),
            "torch eager bf16": lambda: formula(tb[nxt()]),
            "torch.compile bf16": lambda: compiled(tb[nxt()]),
            "tokenpos bf16 kernel (out=)": lambda: K.embedding_forward(w, batches[nxt()], scale=s, pos_table=pt,
                                                                       pos_ids=pos, out=out, bf16=True),
            "tokenpos bf16 kernel (out=, dropout 0.1)": lambda: K.embedding_forward(
                w, batches[nxt()], scale=s, pos_table=pt, pos_ids=pos, out=out, bf16=True, dropout_p=0.1, seed=3),
        }
        for f in impls.values():
            f()
        clock = time.process_time if CPU_TIME else time.perf_counter
        times = {k: [] for k in impls}
        order = np.random.default_rng(1)
        for _ in range(reps):
            for k in order.permutation(list(impls)):
                t0 = clock()
                impls[k]()
                times[k].append(clock() - t0)
    lim_b = min(min(times[k]) for k in times if k.startswith("gather"))
    lim_m = min(float(np.median(times[k])) for k in times if k.startswith("gather"))
    cb, cm = min(times["torch.compile bf16"]), float(np.median(times["torch.compile bf16"]))
    print(f"{'impl':42s} {'best ms':>8s} {'med ms':>8s}  x limit b/m   x compile b/m")
    for k, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{k:42s} {b * 1e3:8.2f} {m * 1e3:8.2f}  {lim_b / b:5.2f}/{lim_m / m:4.2f}   {cb / b:5.2f}/{cm / m:4.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
