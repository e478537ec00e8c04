"""Huge pages for the token table: the kernel and torch's gather on the same values, stored in a
table from torch's allocator (4 KiB pages) and in the public layer's own table.

Usage: python benchmarks/experiments/exp_hugepages.py [--reps N] [--quick]

``tokenpos.torch.TokenEmbedding`` asks the OS for transparent huge pages (``madvise``) before its
table's first write, as NumPy does for its large arrays; a plain ``torch.empty`` table gets 4 KiB
pages unless the machine's ``transparent_hugepage`` setting is ``always`` (printed first). Both
tables hold the same values (V=50257, D=768, fp32 and bf16); each is gathered by the tokenpos
kernel (``embedding_forward(..., out=)``) and by ``torch.index_select(out=)``, interleaved in
``tokenpos bench``'s conditions. Prints best / median ms per row.

Public APIs only: :mod:`tokenpos.torch`, :mod:`tokenpos.kernels`, :mod:`tokenpos.analysis.bench_timing`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _cli import FULL, QUICK, parse, parser  # the shared command line (this folder is on sys.path when run)

import tokenpos.torch as tpt
from tokenpos.analysis.bench_timing import machine, time_interleaved, timing_lines
from tokenpos.kernels import embedding_forward

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 25, "interleaved reps")
    args, reps = parse(ap, argv)
    V, D, L, B = QUICK if args.quick else FULL
    print(machine())
    print(f"transparent_hugepage: {THP.read_text().strip() if THP.exists() else 'unknown (not Linux?)'}")
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32))
    ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
    tids = [torch.from_numpy(i) for i in ids]
    turn = count()

    def nxt() -> int:
        return next(turn) % len(ids)

    impls: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            bf16 = dtype == torch.bfloat16
            plain = torch.empty(V, D, dtype=dtype).copy_(src)                      # torch's allocator
            layer = tpt.TokenEmbedding(V, D, dtype=dtype).weight.detach().copy_(src)  # advised before its first write
            for label, W in (("torch.empty table", plain), ("TokenEmbedding table", layer)):
                w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
                out = np.empty((B * L, D), w.dtype)
                o_t = torch.empty(B * L, D, dtype=dtype)
                name = f"{'bf16' if bf16 else 'fp32'} {label}"
                impls[f"{name}: tokenpos kernel"] = (lambda w=w, out=out, bf16=bf16: embedding_forward(
                    w, ids[nxt()], scale=27.7, out=out, bf16=bf16))
                impls[f"{name}: torch.index_select"] = (lambda W=W, o_t=o_t: torch.index_select(
                    W, 0, tids[nxt()], out=o_t))
        times = time_interleaved(impls, reps)
    print("\n".join(timing_lines(times)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
