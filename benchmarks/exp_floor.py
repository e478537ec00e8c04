"""How close a Python ``nn.Module`` can get to the raw kernel: the floor under issue 10's 5 % target.

``python benchmarks/exp_floor.py [reps]``. The forward (V=50257, D=768, B=16, L=512, fp32, eval,
learned positions, sqrt(D) scale) run five ways, in :mod:`exp_overhead`'s conditions (each timed
call follows its own untimed call's 25 MB of writes), with the compiled core timed inside:

- ``kernel (out=)``: ``kernels.embedding.embedding_forward`` into a preallocated output (the
  reference of issue 10's measure);
- ``bare``: no checks at all: ``ids.numpy()``, ``np.empty``, the compiled core's wrapper
  (``run_forward``), ``torch.from_numpy``;
- ``inlined module``: an ``nn.Module`` whose ``forward`` makes, inline in one function, the checks
  the public layer makes for this configuration (id tensor type, layout, dtype, device and rank;
  sequence length against the table; kernels on, not compiling, no ``torch.func``, no autograd
  needed; contiguity and dtypes of the arrays), then the bare route; it handles no other case;
- ``torch layer`` / ``numpy layer``: the public layers.

Prints, per route, the Python time outside the core minus the kernel route's in the same rep
(median, q25), and the ratio kernel / route that Python cost alone allows at the median core time.
The inlined module is not a proposal (it is the parallel hand-kept path issue 10 removed); it
measures what any Python module with these checks pays when its code runs with cold caches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import exp_overhead as eo
import numpy as np
import torch

import tokenpos.kernels.embedding as ke
import tokenpos.torch as tpt
from tokenpos._config import kernels_enabled
from tokenpos.kernels.embedding import run_forward

_INT = (torch.int64, torch.int32)


class Inlined(torch.nn.Module):
    """The eval forward of ``TransformerEmbedding(V, D, L, scale=True)`` with its checks inline."""

    def __init__(self, layer: tpt.TransformerEmbedding) -> None:
        super().__init__()
        self.weight, self.table = layer.token.weight, layer.position.weight
        self.scale = layer.token.multiplier

    def forward(self, ids: Any) -> torch.Tensor:
        weight, table = self.weight, self.table
        if not (type(ids) is torch.Tensor and ids.dtype in _INT and ids.is_cpu and not ids.is_nested
                and ids.layout == torch.strided and ids.dim() in (1, 2) and ids.shape[-1] <= table.shape[0]):
            raise TypeError("not the case this module measures")
        if not (weight.is_cpu and weight.dtype == table.dtype == torch.float32 and kernels_enabled()
                and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()
                and not (torch.is_grad_enabled() and (weight.requires_grad or table.requires_grad))):
            raise TypeError("not the case this module measures")
        i, w, t = ids.numpy(), weight.detach().numpy(), table.detach().numpy()
        if not (i.dtype == np.int64 and i.flags.c_contiguous and i.size and w.flags.c_contiguous
                and t.flags.c_contiguous):
            raise TypeError("not the case this module measures")
        out = np.empty((*i.shape, w.shape[1]), np.float32)
        if run_forward(w, i.reshape(-1), t, np.arange(i.shape[-1]), self.scale, 0.0, 0, out.reshape(-1, w.shape[1])):
            raise ValueError("an id out of range")
        return torch.from_numpy(out)


def _routes() -> dict[str, Callable[[], Any]]:
    impls = eo._embedding_impls(torch.float32, 0.0)         # kernel (out=), torch layer, numpy layer
    layer = tpt.TransformerEmbedding(eo.V, eo.D, eo.L, scale=True, seed=0).eval()
    inlined = Inlined(layer)
    w, t, s = layer.token.weight.detach().numpy(), layer.position.weight.detach().numpy(), layer.token.multiplier
    batches = [torch.randint(0, eo.V, (eo.B, eo.L)) for _ in range(4)]
    turn, alive = iter(range(1 << 30)), {}

    def bare(ids: torch.Tensor) -> torch.Tensor:
        i = ids.numpy()
        out = np.empty((*i.shape, w.shape[1]), np.float32)
        run_forward(w, i.reshape(-1), t, np.arange(i.shape[-1]), s, 0.0, 0, out.reshape(-1, w.shape[1]))
        return torch.from_numpy(out)

    impls["bare"] = lambda: alive.__setitem__("b", bare(batches[next(turn) % 4]))
    impls["inlined module"] = lambda: alive.__setitem__("i", inlined(batches[next(turn) % 4]))
    return impls


def main(reps: int = 40) -> None:
    acc: list[float] = []
    eo._timed(ke, "forward_core", acc)
    with torch.no_grad():
        res = eo.measure(_routes(), acc, reps)
    kernel = np.array(res["kernel (out=)"][0]) * 1e6
    core = np.median(np.concatenate([np.array(c) for _, c in res.values()])) * 1e6
    k_total = core + np.median(kernel)
    print(f"core median {core:.0f} us; kernel route outside the core {np.median(kernel):.1f} us")
    for name, (ts, _) in res.items():
        d = np.array(ts) * 1e6 - kernel
        print(f"{name:16s} minus the kernel route: median {np.median(d):6.1f} us, q25 {np.percentile(d, 25):6.1f} us;"
              f"  kernel / route at the median core: {k_total / (k_total + np.median(d)):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
