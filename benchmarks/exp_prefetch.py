"""The forward core's software prefetch: how many visits ahead.

``python benchmarks/exp_prefetch.py MODE [reps] [AHEAD,...]``, MODE ``fp32``, ``dropout`` or
``bf16``. Runs ``forward_core`` (no wrapper) on the bench's shapes (V=50257, D=768, B=16, L=512,
ids cycled over 4 batches, huge-page table as the layers allocate it) with each distance: before
each 64-byte line of a row is computed, the same line of the token row AHEAD visits on is
prefetched into L1 (0: none). Interleaved with the plain parallel numba gather and the compute floor
(the core on a 64-row table that stays in cache); prints best / median ms and x gather.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from tokenpos.analysis.bench_cases import gather_rows
from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.kernels._forward import forward_core
from tokenpos.kernels._rng import dropout_params
from tokenpos.kernels._threading import parallel_guard
from tokenpos.kernels.embedding import BY_POSITION, PREFETCH_ROWS, TASK_BYTES
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16
DEFAULT = "0,1,2,4,8"


def main(mode: str, reps: int, settings: str) -> None:
    rng = np.random.default_rng(0)
    bf16 = mode == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    W = empty_table(V, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32)))
    P = empty_table(L, D, dtype=dtype).copy_(torch.randn(L, D, generator=torch.Generator().manual_seed(1)))
    w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
    pt = P.view(torch.uint16).numpy() if bf16 else P.numpy()
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    pos = np.arange(L)
    out = torch.empty(B * L, D, dtype=dtype)                 # 64-byte aligned, as torch allocates
    out = out.view(torch.uint16).numpy() if bf16 else out.numpy()
    small = np.ascontiguousarray(w[:64])
    bits, thr, inv = dropout_params(5, 0.1) if mode == "dropout" else (np.uint64(0), np.uint64(0), 1.0)
    rows = max(1, TASK_BYTES // (D * out.itemsize))
    it = iter(range(1 << 30))

    def batch() -> np.ndarray:
        return ids[next(it) % 4]


    def core(ahead: int, table: np.ndarray):
        def run() -> None:
            with parallel_guard():
                forward_core(table, batch() % table.shape[0], np.float32(27.7), pt, pos, True, bits, thr,
                             np.float32(inv), np.uint64(0), True, False, np.uint64(0), rows, BY_POSITION, ahead,
                             out)
        return run

    def gather() -> None:
        with parallel_guard():
            gather_rows(w, batch(), out)

    impls = {"plain parallel numba gather": gather, "compute floor (64-row table)": core(PREFETCH_ROWS, small)}
    for s in settings.split(","):
        impls[f"prefetch {int(s)} visits ahead"] = core(int(s), w)
    times = time_interleaved(impls, reps)
    gb, gm = min(times[next(iter(impls))]), np.median(times[next(iter(impls))])
    for name, ts in times.items():
        print(f"{mode:8s} {name:34s} best {min(ts) * 1e3:6.2f} ms  median {np.median(ts) * 1e3:6.2f} ms  "
              f"x gather {gb / min(ts):.2f} / {gm / np.median(ts):.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 40,
         sys.argv[3] if len(sys.argv) > 3 else DEFAULT)
