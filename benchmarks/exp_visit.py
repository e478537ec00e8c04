"""The forward core's visiting order: tiles of consecutive rows, or position by position.

``python benchmarks/exp_visit.py MODE [reps]``, MODE ``fp32``, ``dropout`` or ``bf16``. Runs
``forward_core`` (no wrapper) on the bench's shapes (V=50257, D=768, B=16, L=512, ids cycled over
4 batches, tables allocated as the layers allocate them: huge pages, 64-byte aligned) in two tile
shapes:

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

import numpy as np
import torch

from tokenpos.analysis.bench_cases import gather_rows
from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.kernels._forward import forward_core
from tokenpos.kernels._rng import dropout_params
from tokenpos.kernels._threading import parallel_guard
from tokenpos.kernels.embedding import PREFETCH_ROWS, TASK_BYTES
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16
FLOOR_ROWS = 64


def main(mode: str, reps: int) -> None:
    rng = np.random.default_rng(0)
    bf16 = mode == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    W = empty_table(V, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32)))
    P = empty_table(L, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((L, D), dtype=np.float32)))
    w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
    pt = P.view(torch.uint16).numpy() if bf16 else P.numpy()
    small = np.ascontiguousarray(w[:FLOOR_ROWS])
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    pos = np.arange(L)
    out = torch.empty(B * L, D, dtype=dtype)                     # 64-byte aligned, as torch allocates
    o = out.view(torch.uint16).numpy() if bf16 else out.numpy()
    bits, thr, inv = dropout_params(5, 0.1) if mode == "dropout" else (np.uint64(0), np.uint64(0), 1.0)
    rows = max(1, TASK_BYTES // (D * o.itemsize))
    it = iter(range(1 << 30))

    def core(by_position: bool, table: np.ndarray):
        def run() -> None:
            batch = ids[next(it) % 4] % table.shape[0]
            with parallel_guard():
                forward_core(table, batch, np.float32(27.7), pt, pos, True, bits, thr, np.float32(inv),
                             np.uint64(0), True, False, np.uint64(0), rows, by_position, PREFETCH_ROWS, o)
        return run

    def gather() -> None:
        with parallel_guard():
            gather_rows(w, ids[next(it) % 4], o)

    impls = {"plain parallel numba gather": gather}
    for by_position in (False, True):
        name = "by position" if by_position else "consecutive"
        impls[f"core, {name}"] = core(by_position, w)
        impls[f"floor (64-row table), {name}"] = core(by_position, small)
    times = time_interleaved(impls, reps)
    gb, gm = min(times[next(iter(impls))]), np.median(times[next(iter(impls))])
    for name, ts in times.items():
        print(f"{mode:8s} {name:34s} best {min(ts) * 1e3:6.2f} ms  median {np.median(ts) * 1e3:6.2f} ms  "
              f"x gather {gb / min(ts):.2f} / {gm / np.median(ts):.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
