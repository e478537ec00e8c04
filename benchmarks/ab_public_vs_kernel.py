"""A/B: the public torch TransformerEmbedding vs the raw kernel on the SAME tables and ids, interleaved.

Run on a quiet machine: ``python benchmarks/ab_public_vs_kernel.py [reps]``. Prints best / median ms.

- ``public``: ``emb(ids)`` (eval, no grad): checks, then one ``tokenpos::embedding`` call.
- ``kernel_out``: ``embedding_forward(W, ids, ..., out=buf)`` into one reused buffer (the bench's row).
- ``kernel_fresh``: the same with a fresh output per call from ``cpu_empty``, as the layer allocates.
- ``kernel_empty``: the same with a fresh ``torch.empty`` output (new memory: page faults).
- ``gather``: ``torch.index_select`` of the same rows (no arithmetic).

Every result is kept alive until that impl's next call, as a training loop keeps its activations.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

import tokenpos.torch as tpt
from tokenpos.kernels.embedding import embedding_forward
from tokenpos.torch.ops._dispatch import cpu_empty

V, D, L, B = 50257, 768, 512, 16


def main(reps: int = 40) -> None:
    emb = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    batches = [torch.randint(0, V, (B, L)) for _ in range(4)]
    W, P = emb.token.weight.detach(), emb.position.weight.detach()
    buf, pos, scale = torch.empty(B, L, D), np.arange(L), emb.token.multiplier

    def public(i: int) -> torch.Tensor:
        return emb(batches[i % 4])

    def kernel_out(i: int) -> torch.Tensor:
        embedding_forward(W.numpy(), batches[i % 4].numpy(), scale=scale, pos_table=P.numpy(), pos_ids=pos,
                          out=buf.numpy())
        return buf

    def kernel_empty(i: int) -> torch.Tensor:
        out = torch.empty(B, L, D)
        embedding_forward(W.numpy(), batches[i % 4].numpy(), scale=scale, pos_table=P.numpy(), pos_ids=pos,
                          out=out.numpy())
        return out

    def kernel_fresh(i: int) -> torch.Tensor:
        out = cpu_empty((B, L, D), torch.float32)
        embedding_forward(W.numpy(), batches[i % 4].numpy(), scale=scale, pos_table=P.numpy(), pos_ids=pos,
                          out=out.numpy())
        return out

    def gather(i: int) -> torch.Tensor:
        return torch.index_select(W, 0, batches[i % 4].view(-1))

    impls = (public, kernel_out, kernel_fresh, kernel_empty, gather)
    times: dict[str, list[float]] = {f.__name__: [] for f in impls}
    alive: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for f in impls:
            f(0)
        for r in range(reps):
            for f in impls:
                t = time.perf_counter()
                alive[f.__name__] = f(r)
                times[f.__name__].append(time.perf_counter() - t)
    kb, km = min(times["kernel_out"]), float(np.median(times["kernel_out"]))
    for name, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{name:13s} best {b * 1e3:6.2f} ms   median {m * 1e3:6.2f} ms   "
              f"x kernel_out {kb / b:4.2f} / {km / m:4.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
