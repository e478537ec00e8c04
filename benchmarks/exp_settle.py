"""How many untimed calls a core needs after the bench's 25 ms settle before it runs at its busy speed.

``python benchmarks/exp_settle.py [settle_seconds] [reps]``. For 1, 2, 3, 5 and 10 untimed calls
after each sleep, times the plain parallel numba gather, the forward core (random rows) and its
compute floor (a 64-row table that stays in cache) on the bench's fp32 shapes
(:mod:`_forward_case`); prints best / median ms and x gather. With ``settle_seconds`` 0 it shows
the busy speed itself. ``tokenpos bench`` uses :data:`tokenpos.analysis.bench_timing.WARM_CALLS`.
"""

from __future__ import annotations

import sys

from _forward_case import ForwardCase, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved


def main(settle: float, reps: int) -> None:
    case = ForwardCase("fp32")
    impls = {"gather": case.gather, "core": case.core(case.w), "floor (64-row table)": case.core(case.small)}
    for warm in (1, 2, 3, 5, 10):
        print_vs_gather(f"{warm:2d} calls", time_interleaved(impls, reps, settle=settle, warm=warm))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 0.025, int(sys.argv[2]) if len(sys.argv) > 2 else 15)
