"""The forward core's software prefetch: how many visits ahead.

``python benchmarks/exp_prefetch.py MODE [reps] [AHEAD,...]``, MODE ``fp32``, ``dropout`` or
``bf16``. Runs ``forward_core`` (no wrapper) on the bench's shapes (:mod:`_forward_case`) with each
distance: before each 64-byte line of a row is computed, the same line of the token row AHEAD
visits on is prefetched into L1 (0: none). Interleaved with the plain parallel numba gather and the
compute floor (the core on a 64-row table that stays in cache), in ``tokenpos bench``'s conditions;
prints best / median ms and x gather.
"""

from __future__ import annotations

import sys

from _forward_case import ForwardCase, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved

DEFAULT = "0,1,2,4,8"


def main(mode: str, reps: int, settings: str) -> None:
    case = ForwardCase(mode)
    impls = {"plain parallel numba gather": case.gather, "compute floor (64-row table)": case.core(case.small)}
    for s in settings.split(","):
        impls[f"prefetch {int(s)} visits ahead"] = case.core(case.w, ahead=int(s))
    print_vs_gather(mode, time_interleaved(impls, reps))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 40,
         sys.argv[3] if len(sys.argv) > 3 else DEFAULT)
