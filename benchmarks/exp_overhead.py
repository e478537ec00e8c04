"""Per-call Python cost of each route to the forward kernel, cold: every timed call follows a 25 MB
copy, as in the bench, so the interpreter's and torch's code are no longer in L1/L2.

``python benchmarks/exp_overhead.py [reps]``: medians in us at B=1, L=8 (the kernel costs nothing).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.kernels._forward import forward_core  # noqa: F401  (compiled before timing)
from tokenpos.kernels.embedding import embedding_forward
from tokenpos.torch.ops.embedding import forward_impl
from tokenpos.torch.ops.entry import embed, no_seed

V, D, L = 50257, 768, 512


def main(reps: int = 200) -> None:
    emb = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    rope = tpt.RotaryEmbedding(64).eval()
    nemb = tpn.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    ids = torch.randint(0, V, (1, 8))
    q = torch.randn(1, 12, 8, 64)
    k = torch.randn(1, 12, 8, 64)
    W, P = emb.token.weight, emb.position.weight
    Wd, Pd = W.detach(), P.detach()
    pos = torch.arange(8)
    nids, npos, buf = ids.numpy(), pos.numpy(), np.empty((1, 8, D), np.float32)
    seed, s = no_seed(W.device), emb.token.multiplier
    big_a, big_b = torch.empty(25 << 18), torch.empty(25 << 18)
    cases = {
        "kernel(out=) on numpy": lambda: embedding_forward(Wd.numpy(), nids, scale=s, pos_table=Pd.numpy(),
                                                           pos_ids=npos, out=buf),
        "kernel, fresh output": lambda: embedding_forward(Wd.numpy(), nids, scale=s, pos_table=Pd.numpy(),
                                                          pos_ids=npos),
        "op impl (forward_impl)": lambda: forward_impl(W, ids, P, pos, s, 0.0, seed, -1),
        "embed()": lambda: embed(W, ids, P, pos, scale=s),
        "torch layer": lambda: emb(ids),
        "numpy layer": lambda: nemb(nids),
        "torch rope_qk layer": lambda: rope(q, k),
    }
    times: dict[str, list[float]] = {n: [] for n in cases}
    with torch.no_grad():
        for f in cases.values():
            f()
        for _ in range(reps):
            for name, f in cases.items():
                big_b.copy_(big_a)
                time.sleep(0.002)
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        print(f"{name:26s} median {np.median(ts) * 1e6:7.1f} us   best {min(ts) * 1e6:7.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
