"""The forward core's software prefetch: how far ahead, and how much of the token row.

``python benchmarks/exp_prefetch.py MODE [reps] [AHEAD@LINES,...]``, MODE ``fp32``, ``dropout`` or
``bf16``. Runs ``forward_core`` (no wrapper) on the bench's shapes (V=50257, D=768, B=16, L=512,
ids cycled over 4 batches, huge-page table as the layers allocate it) with each prefetch setting:
the first LINES 64-byte lines of the token row AHEAD rows ahead are prefetched into L2 (``0@0``:
none). Interleaved with the plain parallel numba gather; prints best / median ms and x gather.
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
from tokenpos.kernels.embedding import PREFETCH_LINES, PREFETCH_ROWS, TASK_BYTES
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16
DEFAULT = f"0@0,2@4,{PREFETCH_ROWS}@4,{PREFETCH_ROWS}@{PREFETCH_LINES},6@8,{PREFETCH_ROWS}@16,{PREFETCH_ROWS}@48"


def main(mode: str, reps: int, settings: str) -> None:
    rng = np.random.default_rng(0)
    bf16 = mode == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    W = empty_table(V, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32)))
    P = torch.randn(L, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
    pt = P.view(torch.uint16).numpy() if bf16 else P.numpy()
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    pos = np.arange(L)
    out = np.empty((B * L, D), w.dtype)
    bits, thr, inv = dropout_params(5, 0.1) if mode == "dropout" else (np.uint64(0), np.uint64(0), 1.0)
    rows = max(1, TASK_BYTES // (D * out.itemsize))
    it = iter(range(1 << 30))

    def batch() -> np.ndarray:
        return ids[next(it) % 4]

    def core(ahead: int, lines: int):
        def run() -> None:
            with parallel_guard():
                forward_core(w, batch(), np.float32(27.7), pt, pos, True, bits, thr, np.float32(inv), np.uint64(0),
                             True, False, np.uint64(0), rows, False, ahead, lines, out)
        return run

    def gather() -> None:
        with parallel_guard():
            gather_rows(w, batch(), out)

    impls = {"plain parallel numba gather": gather}
    for s in settings.split(","):
        ahead, lines = (int(v) for v in s.split("@"))
        impls[f"prefetch {lines:2d} lines, {ahead} rows ahead"] = core(ahead, lines)
    times = time_interleaved(impls, reps)
    gb, gm = min(times[next(iter(impls))]), np.median(times[next(iter(impls))])
    for name, ts in times.items():
        print(f"{mode:8s} {name:34s} best {min(ts) * 1e3:6.2f} ms  median {np.median(ts) * 1e3:6.2f} ms  "
              f"x gather {gb / min(ts):.2f} / {gm / np.median(ts):.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 40,
         sys.argv[3] if len(sys.argv) > 3 else DEFAULT)
