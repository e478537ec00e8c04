"""A/B: each public layer vs the raw kernel it calls, on the SAME tables and inputs, timed as the bench
times (``analysis.bench_timing.time_interleaved``: settle, one untimed call, the timed call).

``python benchmarks/ab_public_vs_kernel.py [reps]``: best / median ms and public / kernel ratios for
the forward (eval), forward + dropout (train, no grad), bf16 forward and RoPE on q and k.
Every result is kept alive until that impl's next call, as a model keeps its activations.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.kernels.embedding import embedding_forward
from tokenpos.kernels.rope import rope_apply

V, D, L, B, H, Dh = 50257, 768, 512, 16, 12, 64


def _impls() -> dict[str, dict[str, object]]:
    emb = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    drop = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, dropout=0.1, seed=0).train()
    e16 = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0, dtype=torch.bfloat16).eval()
    nemb = tpn.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    rope = tpt.RotaryEmbedding(Dh, max_seq_len=L).eval()
    nrope = tpn.RotaryEmbedding(Dh, max_seq_len=L)
    batches = [torch.randint(0, V, (B, L)) for _ in range(4)]
    nb = [b.numpy() for b in batches]
    W, P = emb.token.weight.detach().numpy(), emb.position.weight.detach().numpy()
    W16 = e16.token.weight.detach().view(torch.uint16).numpy()
    P16 = e16.position.weight.detach().view(torch.uint16).numpy()
    pos, s = np.arange(L), emb.token.multiplier
    q, k = torch.randn(B, H, L, Dh), torch.randn(B, H, L, Dh)
    c = rope.cos_cached[:L].float().numpy()
    sn = rope.sin_cached[:L].float().numpy()
    bufs = {n: np.empty((B, L, D), np.float32) for n in ("f", "d")}
    b16 = np.empty((B, L, D), np.uint16)
    oq, ok = np.empty_like(q.numpy()), np.empty_like(k.numpy())
    it = iter(range(10**9))
    nxt = lambda: next(it) % 4  # noqa: E731
    return {
        "forward": {
            "kernel(out=)": lambda: embedding_forward(W, nb[nxt()], scale=s, pos_table=P, pos_ids=pos,
                                                      out=bufs["f"]),
            "torch layer": lambda: emb(batches[nxt()]),
            "numpy layer": lambda: nemb(nb[nxt()]),
        },
        "dropout": {
            "kernel(out=)": lambda: embedding_forward(W, nb[nxt()], scale=s, pos_table=P, pos_ids=pos,
                                                      dropout_p=0.1, seed=12345, out=bufs["d"]),
            "torch layer": lambda: drop(batches[nxt()]),
        },
        "bf16": {
            "kernel(out=)": lambda: embedding_forward(W16, nb[nxt()], scale=s, pos_table=P16, pos_ids=pos,
                                                      out=b16, bf16=True),
            "torch layer": lambda: e16(batches[nxt()]),
        },
        "rope": {
            "kernel(out=)": lambda: rope_apply(q.numpy(), k.numpy(), c, sn, out_q=oq, out_k=ok),
            "torch layer": lambda: rope(q, k),
            "numpy layer": lambda: nrope(q.numpy(), k.numpy()),
        },
    }


def main(reps: int = 30) -> None:
    alive: dict[str, object] = {}
    with torch.no_grad():
        for case, impls in _impls().items():
            alive.clear()

            def keep(name: str, f):  # noqa: ANN001, ANN202
                def run():  # noqa: ANN202
                    alive[name] = f()
                return run

            times = time_interleaved({n: keep(n, f) for n, f in impls.items()}, reps)
            kb, km = min(times["kernel(out=)"]), float(np.median(times["kernel(out=)"]))
            for name, ts in times.items():
                b, m = min(ts), float(np.median(ts))
                print(f"{case:8s} {name:13s} best {b * 1e3:6.2f} ms  median {m * 1e3:6.2f} ms  "
                      f"x kernel {kb / b:4.2f} / {km / m:4.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
