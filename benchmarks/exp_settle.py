"""How many untimed calls a core needs after the bench's 25 ms settle before it runs at its busy speed.

``python benchmarks/exp_settle.py [settle_seconds] [reps]``. For 1, 2, 3, 5 and 10 untimed calls
after each sleep, times the plain parallel numba gather, the forward core (random rows) and its
compute floor (a 64-row table that stays in cache) on the bench's fp32 shapes (V=50257, D=768,
B=16, L=512); prints best / median ms and x gather. With ``settle_seconds`` 0 it shows the busy
speed itself. ``tokenpos bench`` uses :data:`tokenpos.analysis.bench_timing.WARM_CALLS`.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from tokenpos.analysis.bench_cases import gather_rows
from tokenpos.kernels._forward import forward_core
from tokenpos.kernels._threading import parallel_guard
from tokenpos.kernels.embedding import BY_POSITION, PREFETCH_ROWS, TASK_BYTES
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16


def main(settle: float, reps: int) -> None:
    rng = np.random.default_rng(0)
    w = empty_table(V, D).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32))).numpy()
    pt = empty_table(L, D).copy_(torch.from_numpy(rng.standard_normal((L, D), dtype=np.float32))).numpy()
    small = np.ascontiguousarray(w[:64])
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    pos = np.arange(L)
    out = torch.empty(B * L, D).numpy()
    rows = max(1, TASK_BYTES // (D * 4))
    it = iter(range(1 << 30))
    zero = np.uint64(0)

    def core(table: np.ndarray):
        def run() -> None:
            with parallel_guard():
                forward_core(table, ids[next(it) % 4] % table.shape[0], np.float32(27.7), pt, pos, True, zero, zero,
                             np.float32(1.0), zero, True, False, zero, rows, BY_POSITION, PREFETCH_ROWS, out)
        return run

    def gather() -> None:
        with parallel_guard():
            gather_rows(w, ids[next(it) % 4], out)

    impls = {"gather": gather, "core": core(w), "floor (64-row table)": core(small)}
    for fn in impls.values():
        fn()
    for warm in (1, 2, 3, 5, 10):
        times: dict[str, list[float]] = {n: [] for n in impls}
        for _ in range(reps):
            for name, fn in impls.items():
                time.sleep(settle)
                for _ in range(warm):
                    fn()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        gb, gm = min(times["gather"]), float(np.median(times["gather"]))
        print(f"settle {settle} s, {warm:2d} untimed calls: " + "  ".join(
            f"{n} {min(t) * 1e3:.2f}/{np.median(t) * 1e3:.2f} ms ({gb / min(t):.2f}/{gm / np.median(t):.2f})"
            for n, t in times.items()))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 0.025, int(sys.argv[2]) if len(sys.argv) > 2 else 15)
