"""What the fused forward pays for its positional rows, against the torch gather limit, in one run.

``python benchmarks/exp_posread.py MODE [reps]``, MODE ``fp32``, ``dropout`` or ``bf16``. Runs
``forward_core`` (no wrapper) on the bench's shapes (:mod:`_forward_case`) three ways: as the layers
call it; with every row at position 0 (its positional row stays in L1, so the 25 MB (fp32) of
positional reads from L3 disappear, the arithmetic stays); and without positions. Interleaved with
``torch.index_select(out=)`` (the bench's gather limit) and the plain parallel numba gather, in
``tokenpos bench``'s conditions (``time_interleaved``). Prints best / median ms and x
``index_select``, then each impl's quartiles (the kernel's times are bimodal on a shared guest).
"""

from __future__ import annotations

import sys
from itertools import count

import numpy as np
from _forward_case import D, ForwardCase, L, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.kernels._forward import forward_core
from tokenpos.kernels._threading import parallel_guard
from tokenpos.kernels.embedding import prefetch_rows


def main(mode: str, reps: int) -> None:
    case = ForwardCase(mode)
    it = count()
    ahead, far = prefetch_rows(D * case.out.itemsize)

    def core(has_pos: bool, pos: np.ndarray):
        def run() -> None:
            with parallel_guard():
                forward_core(case.w, case.ids[next(it) % len(case.ids)], np.float32(27.7), case.pt, pos, has_pos,
                             case.bits, case.thr, case.inv, np.uint64(0), True, False, np.uint64(0), 1, ahead, far,
                             case.out)
        return run

    impls = {"torch.index_select(out=)": case.index_select, "plain parallel numba gather": case.gather,
             "core": core(True, case.pos), "core, every row at position 0": core(True, np.zeros(L, np.int64)),
             "core, no positions": core(False, case.pos)}
    times = time_interleaved(impls, reps)
    print_vs_gather(mode, times)
    for name, ts in times.items():
        q25, q50, q75 = np.percentile(np.array(ts) * 1e3, [25, 50, 75])
        print(f"{mode:8s} {name:34s} quartiles {q25:6.2f} {q50:6.2f} {q75:6.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
