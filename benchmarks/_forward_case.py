"""The forward-core experiments' shared set-up (``exp_prefetch``, ``exp_settle``, ``ab_kernel_versions``).

The bench's shapes (V=50257, D=768, B=16, L=512, ids cycled over 4 batches), tables allocated as the
layers allocate them (huge pages, 64-byte aligned), the core called without its Python wrapper, the
plain parallel numba gather and ``torch.index_select(out=)`` (the bench's gather limit) it is compared
with, and the ratio printout.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

import numpy as np
import torch

from tokenpos.analysis.bench_cases import gather_rows
from tokenpos.kernels._forward import forward_core
from tokenpos.kernels._rng import dropout_params
from tokenpos.kernels._threading import parallel_guard
from tokenpos.kernels.embedding import TASK_BYTES, prefetch_rows
from tokenpos.torch._init import empty_table

V, D, L, B = 50257, 768, 512, 16
FLOOR_ROWS = 64          # the compute floor's table: stays in cache, so no random reads


class ForwardCase:
    """MODE ``fp32``, ``dropout`` (p = 0.1) or ``bf16``: arrays and callables for one experiment."""

    def __init__(self, mode: str) -> None:
        rng = np.random.default_rng(0)
        self.bf16 = mode == "bf16"
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        W = empty_table(V, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32)))
        P = empty_table(L, D, dtype=dtype).copy_(torch.from_numpy(rng.standard_normal((L, D), dtype=np.float32)))
        out = torch.empty(B * L, D, dtype=dtype)                 # 64-byte aligned, as torch allocates
        self.w, self.pt, self.out = (self._np(t) for t in (W, P, out))
        self._W, self._out_t = W, out                            # the same memory, for index_select
        self.small = np.ascontiguousarray(self.w[:FLOOR_ROWS])
        self.ids = [rng.integers(0, V, (B * L,)) for _ in range(4)]
        self._tids = [torch.from_numpy(i) for i in self.ids]
        self.pos = np.arange(L)
        p = 0.1 if mode == "dropout" else 0.0
        self.bits, self.thr, inv = dropout_params(5, p) if p else (np.uint64(0), np.uint64(0), 1.0)
        self.inv = np.float32(inv)
        self.rows = max(1, TASK_BYTES // (D * self.out.itemsize))
        self._it = count()

    def _np(self, t: torch.Tensor) -> np.ndarray:
        return t.view(torch.uint16).numpy() if self.bf16 else t.numpy()

    def batch(self) -> np.ndarray:
        return self.ids[next(self._it) % len(self.ids)]

    def core(self, table: np.ndarray, *, ahead: int | None = None, far: int | None = None,
             fn: Callable[..., int] = forward_core) -> Callable[[], None]:
        """The forward core ``fn`` on ``table`` (the (V, D) table, or ``small`` for the compute floor)."""
        batches = [ids % table.shape[0] for ids in self.ids]      # ids into ``table``, made before timing
        near, far_default = prefetch_rows(D * self.out.itemsize)
        ahead = near if ahead is None else ahead
        far = far_default if far is None else far

        def run() -> None:
            with parallel_guard():
                fn(table, batches[next(self._it) % len(batches)], np.float32(27.7), self.pt, self.pos, True,
                             self.bits, self.thr, self.inv, np.uint64(0), True, False, np.uint64(0), self.rows,
                             ahead, far, self.out)
        return run

    def gather(self) -> None:
        with parallel_guard():
            gather_rows(self.w, self.batch(), self.out)

    def index_select(self) -> None:
        """``torch.index_select(W, 0, ids, out=out)`` on the same table, ids and output: the bench's
        other gather limit."""
        torch.index_select(self._W, 0, self._tids[next(self._it) % len(self._tids)], out=self._out_t)


def print_vs_gather(label: str, times: dict[str, list[float]]) -> None:
    """One line per impl: best / median ms and x the first impl (the gather), best / median."""
    first = times[next(iter(times))]
    gb, gm = min(first), float(np.median(first))
    for name, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{label:8s} {name:34s} best {b * 1e3:6.2f} ms  median {m * 1e3:6.2f} ms  "
              f"x gather {gb / b:.2f} / {gm / m:.2f}")
