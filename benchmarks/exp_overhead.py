"""The Python time of each route to the kernels, outside the compiled core, in the bench's conditions.

``python benchmarks/exp_overhead.py [reps]``. The embedding cases climb from the raw kernel to the
torch op (``ops.embed``, with autograd in training) and the public layers. Each impl runs as the
bench runs it (a 25 ms settle, one untimed call, then the timed call), so the timed call follows
the impl's own 25 MB of output writes and finds the interpreter's and torch's code out of L1/L2. The compiled core
(``forward_core`` / ``_rope_core``) is timed inside the call; what remains is the route's own
cost. It does not depend on the memory bandwidth the other guests leave, so it is stable on a
busy machine where whole-call times are not. Prints medians and bests in us.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import tokenpos.kernels.embedding as ke
import tokenpos.kernels.rope as kr
import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.torch.ops import embed

V, D, L, B = 50257, 768, 512, 16
H, Dh = 12, 64


def _timed(module: Any, name: str, acc: list[float]) -> None:
    core = getattr(module, name)

    def timed(*args: Any) -> Any:
        t = time.perf_counter()
        r = core(*args)
        acc.append(time.perf_counter() - t)
        return r
    setattr(module, name, timed)


def _embedding_impls(dtype: torch.dtype, p: float) -> dict[str, Callable[[], Any]]:
    emb = tpt.TransformerEmbedding(V, D, L, scale=True, seed=0, dropout=p, dtype=dtype).train(p > 0)
    bf16 = dtype == torch.bfloat16
    W, P = (emb.token.weight.detach(), emb.position.weight.detach())
    w = W.view(torch.uint16).numpy() if bf16 else W.numpy()
    pt = P.view(torch.uint16).numpy() if bf16 else P.numpy()
    batches = [torch.randint(0, V, (B, L)) for _ in range(4)]
    nb = [b.numpy() for b in batches]
    buf = np.empty((B, L, D), np.uint16 if bf16 else np.float32)
    pos, s, alive = np.arange(L), emb.token.multiplier, {}
    it = iter(range(1 << 30))

    def nxt() -> int:
        return next(it) % 4

    tp, seed = torch.arange(L), torch.tensor(5)
    impls: dict[str, Callable[[], Any]] = {
        "kernel (out=)": lambda: ke.embedding_forward(w, nb[nxt()], scale=s, pos_table=pt, pos_ids=pos,
                                                      dropout_p=p, seed=5, out=buf, bf16=bf16),
        "torch op": lambda: alive.__setitem__("o", embed(emb.token.weight, batches[nxt()], emb.position.weight, tp,
                                                         scale=s, p=p, seed=seed, check_ids=True)),
        "torch layer": lambda: alive.__setitem__("t", emb(batches[nxt()])),
    }
    if not bf16:
        nemb = tpn.TransformerEmbedding(V, D, L, scale=True, seed=0, dropout=p).train(p > 0)
        impls["numpy layer"] = lambda: alive.__setitem__("n", nemb(nb[nxt()]))
    return impls


def _rope_impls() -> dict[str, Callable[[], Any]]:
    q, k = torch.randn(8, H, L, Dh), torch.randn(8, H, L, Dh)
    qn, kn = q.numpy(), k.numpy()
    rope, nrope = tpt.RotaryEmbedding(Dh, max_seq_len=L), tpn.RotaryEmbedding(Dh, max_seq_len=L)
    c, s = rope.cos_cached[:L].float().numpy(), rope.sin_cached[:L].float().numpy()
    oq, ok, alive = np.empty_like(qn), np.empty_like(kn), {}
    return {"kernel (out=)": lambda: kr.rope_apply(qn, kn, c, s, out_q=oq, out_k=ok),
            "torch layer": lambda: alive.__setitem__("t", rope.apply(q, k)),
            "numpy layer": lambda: alive.__setitem__("n", nrope.apply(qn, kn))}


def measure(impls: dict[str, Callable[[], Any]], acc: list[float], reps: int
            ) -> dict[str, tuple[list[float], list[float]]]:
    """Per impl: (times outside the core, times of the core), one of each per rep."""
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in impls}
    for _ in range(reps):
        for name, f in impls.items():
            time.sleep(0.025)
            f()
            acc.clear()
            t = time.perf_counter()
            f()
            out[name][0].append(time.perf_counter() - t - acc[0])
            out[name][1].append(acc[0])
    return out


def main(reps: int = 40) -> None:
    acc: list[float] = []
    _timed(ke, "forward_core", acc)
    _timed(kr, "_rope_core", acc)
    cases = {"forward": lambda: _embedding_impls(torch.float32, 0.0),
             "dropout": lambda: _embedding_impls(torch.float32, 0.1),
             "bf16": lambda: _embedding_impls(torch.bfloat16, 0.0),
             "rope": _rope_impls}
    for case, make in cases.items():
        with torch.set_grad_enabled(case == "dropout"):      # as the bench runs them: training with dropout
            for name, (ts, core) in measure(make(), acc, reps).items():
                us, cus = np.array(ts) * 1e6, np.array(core) * 1e6
                print(f"{case:8s} {name:14s} outside the core: median {np.median(us):6.1f} us, best {us.min():6.1f} us;"
                      f"  the core: median {np.median(cus):7.1f} us, best {cus.min():7.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
