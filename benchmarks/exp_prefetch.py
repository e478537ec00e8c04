"""The forward core's software prefetch: how many rows ahead, into L1 and into L2.

``python benchmarks/exp_prefetch.py MODE [reps] [SETTING,...]``, MODE ``fp32``, ``dropout`` or
``bf16``; a SETTING is ``NEAR`` or ``NEAR:FAR``. Runs ``forward_core`` (no wrapper) on the bench's
shapes (:mod:`_forward_case`) with each setting: before each 64-byte line of a row is computed, the
same line of the token row NEAR rows on is prefetched into L1 and that of the row FAR rows on into
L2 (0: none; FAR left out: none). Interleaved with ``torch.index_select(out=)`` (the bench's gather
limit), the plain parallel numba gather and the compute floor (the core on a 64-row table that
stays in cache), in ``tokenpos bench``'s conditions; prints best / median ms and x ``index_select``.
"""

from __future__ import annotations

import sys

from _forward_case import ForwardCase, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved

DEFAULT = "0,2,4,8,4:8,4:16,8:16,8:32"


def main(mode: str, reps: int, settings: str) -> None:
    case = ForwardCase(mode)
    impls = {"torch.index_select(out=)": case.index_select, "plain parallel numba gather": case.gather,
             "compute floor (64-row table)": case.core(case.small)}
    for s in settings.split(","):
        near, _, far = s.partition(":")
        impls[f"prefetch L1 {int(near)}, L2 {int(far or 0)} rows on"] = case.core(case.w, ahead=int(near),
                                                                                 far=int(far or 0))
    print_vs_gather(mode, time_interleaved(impls, reps))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 30,
         sys.argv[3] if len(sys.argv) > 3 else DEFAULT)
