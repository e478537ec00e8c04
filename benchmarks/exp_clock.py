"""How the CPU speed this guest gets moves the kernels' ratio to the gather, within one process.

``python benchmarks/exp_clock.py MODE [rounds] [reps]``, MODE ``fp32``, ``dropout`` or ``bf16``.
Each round times a fixed integer loop (a chain of dependent 64-bit multiply-adds: no memory, so
only the clock and the core's share of the host move it), then the forward core, its compute floor
(the 64-row table in cache) and the plain parallel numba gather interleaved as ``tokenpos bench``
times them (:mod:`_forward_case`), then the loop again. Nothing else runs in between, so any drift
from round to round is the machine's, not the code's. Prints per round: the loop's ms before and
after, and best ms and x gather of each impl; then the correlation between the loop's time and the
kernel's ratio.

Why: the bench's bf16 row looked worse after the fp32 cases than alone (BENCHMARKS.md,
2026-11-23). On the reference VM, with nothing else running in the process, the loop's time
moved between 0.52 and 1.1 ms and the bf16 kernel's ratio between 0.70x and 0.87x the gather
from one round to the next (10 rounds, 08:40 UTC): the spread a case sees depends on when it runs,
not on which cases ran before it.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from _forward_case import ForwardCase
from numba import njit

from tokenpos.analysis.bench_timing import time_interleaved

LOOP = 3_000_000


@njit(cache=True)
def _chain(n: int) -> np.uint64:  # pragma: no cover - compiled
    x = np.uint64(1)
    for _ in range(n):
        x = x * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)
    return x


def clock_probe(tries: int = 5) -> float:
    """Best of ``tries`` runs of the fixed loop, in ms (lower: a faster core right now)."""
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        _chain(LOOP)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(mode: str, rounds: int, reps: int) -> None:
    case = ForwardCase(mode)
    _chain(10)
    impls = {"gather": case.gather, "kernel": case.core(case.w), "floor": case.core(case.small)}
    probes, ratios = [], []
    for r in range(rounds):
        before = clock_probe()
        times = time_interleaved(impls, reps)
        after = clock_probe()
        g = min(times["gather"])
        cells = "  ".join(f"{k} {min(v) * 1e3:5.2f} ms x{g / min(v):.2f}" for k, v in times.items())
        print(f"{mode} round {r}: loop {before:.3f} -> {after:.3f} ms   {cells}", flush=True)
        probes.append((before + after) / 2)
        ratios.append(g / min(times["kernel"]))
    if rounds > 2:
        print(f"correlation(loop ms, kernel x gather) = {np.corrcoef(probes, ratios)[0, 1]:+.2f} over {rounds} rounds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bf16", int(sys.argv[2]) if len(sys.argv) > 2 else 8,
         int(sys.argv[3]) if len(sys.argv) > 3 else 10)
