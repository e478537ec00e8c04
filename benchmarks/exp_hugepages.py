"""Huge pages for the token table: the kernel and torch's gather on the same values, stored in a
table allocated by torch (4 KiB pages) and in one allocated through ``tokenpos.torch._init.empty_table``
(``madvise(MADV_HUGEPAGE)`` before the first write). ``python benchmarks/exp_hugepages.py [reps]``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import tokenpos.kernels.embedding as ke
from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16


def main(reps: int = 25) -> None:
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32))
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    tids = [torch.from_numpy(i) for i in ids]
    it = iter(range(1 << 30))

    def nxt() -> int:
        return next(it) % 4

    impls = {}
    for dtype in (torch.float32, torch.bfloat16):
        bf16 = dtype == torch.bfloat16
        small = torch.empty(V, D, dtype=dtype)                    # torch's allocator: 4 KiB pages
        small.copy_(src)
        huge = empty_table(V, D, dtype=dtype).copy_(src)         # huge pages where the OS grants them
        for label, W in (("4 KiB pages", small), ("huge pages", huge)):
            w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
            out = np.empty((B * L, D), w.dtype)
            o_t = torch.empty(B * L, D, dtype=dtype)
            name = f"{'bf16' if bf16 else 'fp32'} {label}"
            impls[f"{name}: tokenpos kernel"] = (lambda w=w, out=out, bf16=bf16: ke.embedding_forward(
                w, ids[nxt()], scale=27.7, out=out, bf16=bf16))
            impls[f"{name}: torch.index_select"] = (lambda W=W, o_t=o_t: torch.index_select(
                W, 0, tids[nxt()], out=o_t))
    times = time_interleaved(impls, reps)
    for name, ts in times.items():
        print(f"{name:40s} best {min(ts) * 1e3:6.2f} ms  median {np.median(ts) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 25)
