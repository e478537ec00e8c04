"""The forward core's visiting order: tiles of consecutive rows, or position by position.

``python benchmarks/exp_visit.py MODE [reps]``, MODE ``fp32``, ``dropout`` or ``bf16``. Runs
``forward_core`` (no wrapper) on the bench's shapes (:mod:`_forward_case`) in two tile shapes:

- consecutive: tiles of about 64 KiB of consecutive output rows (one batch row, 21 positions);
- by position: tiles of the 16 batch rows of one position, so the positional row is read once
  into L1 and stays there while its 16 token rows pass; with consecutive rows it is read again,
  from L2 or L3, for every batch row (25 MB of extra reads per call).

Each is timed with the 154 MB table (random rows, the real case) and with a 64-row table that
stays in cache (the compute floor: arithmetic and writes, no random reads), interleaved with the
plain parallel numba gather in ``tokenpos bench``'s conditions (``time_interleaved``). Prints
best / median ms and x gather.
"""

from __future__ import annotations

import sys

from _forward_case import ForwardCase, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved


def main(mode: str, reps: int) -> None:
    case = ForwardCase(mode)
    impls = {"plain parallel numba gather": case.gather}
    for by_position in (False, True):
        name = "by position" if by_position else "consecutive"
        impls[f"core, {name}"] = case.core(case.w, by_position=by_position)
        impls[f"floor (64-row table), {name}"] = case.core(case.small, by_position=by_position)
    print_vs_gather(mode, time_interleaved(impls, reps))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
