"""Experiment: each piece of the forward kernel's machinery, on and off, in model conditions.

Usage: python benchmarks/experiments/exp_machinery.py [--reps N] [--quick]

One process, torch imported first (the kernels on torch's pool, tokenpos's choice since issue 29),
every timed call right after a ~1 GFLOP torch matmul (``bench_timing.model_op``), rows interleaved
and shuffled; for the forward (p = 0) and dropout (p = 0.1) on the bench's workload:

- ``kernel``: ``embedding_forward(..., out=)`` as shipped (line-wise explicit vectors of
  ``kernels/_lines.py``, line-wise prefetch ``PREFETCH_BYTES`` ahead, huge-page table);
- ``no prefetch``: the same with ``embedding.PREFETCH_BYTES = 0``;
- (``stream``: ``stream=True``, non-temporal stores, measured with this script before issue 29
  deleted ``kernels/_stream.py``: benchmarks/HISTORY.md, 2026-11-27);
- ``plain loop``: a plain ``prange`` over rows, each row the element-by-element formula of
  ``kernels/_forward._tail`` (LLVM's own vectoriser; no ``_lines``, no prefetch);
- ``4 KiB pages``: the kernel reading a copy of the table allocated without ``madvise``
  (``tokenpos/_hugepages.py`` off);
- ``out=None, cache`` / ``out=None, no cache``: a fresh output each call from the output block
  cache (``tokenpos/_outputs.py``) or from ``np.empty`` (``set_output_cache(0)`` around the call).

Prints best / median ms and x gather (``torch.index_select``) per row; run it several times.
"""

from __future__ import annotations

import sys

import numpy as np
import torch  # noqa: F401 - first: tokenpos then runs on torch's pool
from _cli import FULL, QUICK, parse, parser
from numba import njit, prange

import tokenpos.kernels as K
from tokenpos._config import output_cache_bytes, set_output_cache
from tokenpos.analysis.bench_timing import machine, model_op, time_interleaved, timing_lines
from tokenpos.kernels import embedding as E
from tokenpos.kernels._forward import tail
from tokenpos.kernels._rng import key_of
from tokenpos.tables.formulas.dropout import dropout_threshold
from tokenpos.torch._init import empty_table


@njit(parallel=True, cache=True)
def plain_forward(w, ids, scale, pt, key, thr, inv, out):  # pragma: no cover - compiled
    L = pt.shape[0]
    for n in prange(ids.shape[0]):
        tail(w[ids[n]], pt[n % L], True, scale, key, thr, inv, np.uint64(n * w.shape[1]), out[n], 0)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 20)
    args, reps = parse(ap, argv)
    V, D, L, B = QUICK if args.quick else FULL
    print(machine())
    rng = np.random.default_rng(0)
    W = empty_table(V, D).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32)))
    w = W.numpy()
    w4k = torch.empty(V, D)                                  # torch's allocator: no madvise
    w4k.copy_(W)
    w4k_np = w4k.numpy()
    pt = rng.standard_normal((L, D), dtype=np.float32)
    batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
    out = np.empty((B, L, D), np.float32)
    tw, tout = torch.from_numpy(w), torch.from_numpy(out).view(B * L, D)
    tb = [torch.from_numpy(b.reshape(-1)) for b in batches]
    pos, scale = np.arange(L), float(np.sqrt(D))
    it = iter(range(1, 1 << 40))
    cache = output_cache_bytes()

    def ids() -> np.ndarray:
        return batches[next(it) % 4]

    def kern(p: float, **kw) -> object:
        table = kw.pop("table", w)
        o = kw.pop("out", out)
        return lambda: K.embedding_forward(table, ids(), scale=scale, pos_table=pt, pos_ids=pos, dropout_p=p,
                                           seed=next(it), out=o, **kw)

    def no_prefetch(p: float) -> object:
        f = kern(p)

        def run() -> None:
            E.PREFETCH_BYTES = 0
            try:
                f()
            finally:
                E.PREFETCH_BYTES = saved
        return run

    def no_cache(p: float) -> object:
        f = kern(p, out=None)

        def run() -> None:
            set_output_cache(0)
            try:
                f()
            finally:
                set_output_cache(cache)
        return run

    def plain(p: float) -> object:
        thr = np.uint64(dropout_threshold(p)) if p else np.uint64(0)
        inv = np.float32(1.0 / (1.0 - p))
        return lambda: plain_forward(w, ids().reshape(-1), np.float32(scale), pt,
                                     np.uint64(key_of(np.uint64(next(it)))), thr, inv, out.reshape(-1, D))

    saved = E.PREFETCH_BYTES
    impls: dict = {"gather": lambda: torch.index_select(tw, 0, tb[next(it) % 4], out=tout)}
    for p in (0.0, 0.1):
        tag = "dropout" if p else "forward"
        impls.update({f"{tag}: kernel": kern(p), f"{tag}: no prefetch": no_prefetch(p),
                      f"{tag}: plain loop": plain(p),
                      f"{tag}: 4 KiB pages": kern(p, table=w4k_np), f"{tag}: out=None, cache": kern(p, out=None),
                      f"{tag}: out=None, no cache": no_cache(p)})
    print("\n".join(timing_lines(time_interleaved(impls, reps, model_op(D)), ref="gather")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
