"""Where a training step under ``torch.compile(mode="reduce-overhead")`` breaks, variant by variant.

What it answers: tests/torch/test_no_host_sync.py's reduce-overhead training step (TransformerEmbedding
with dropout -> q projection -> RoPE -> attention; forward returns the embedding output and the loss)
failed on an H200 (torch 2.11) in ``loss.backward()`` with "accessing tensor output of CUDAGraphs that
has been overwritten by a subsequent run", the tensor made by the embedding op. Each variant below
changes one thing, and a plain-torch twin of the same step is the control: if the twin fails the
same way, the pattern (not tokenpos) is what cudagraph trees refuse.

    python benchmarks/experiments/exp_gpu_reduce_overhead.py        # CUDA only

Prints one line per variant: ok, or the iteration and the first line of the error.

Answer (H100, torch 2.11, 2026-11-28): every variant failed at iteration 1, the plain-torch control
too. What cudagraph trees refuse is the loop, not the layer: it never reset the gradients, so each
``backward`` accumulated into the ``.grad`` the previous replay had written, a graph output that the
next replay overwrites. The test now sets the gradients to None per step, as ``optimizer.zero_grad()``
does, and passes there. The variants below are kept as they ran.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

B, L, DH, V = 2, 5, 8, 13


def variants() -> dict[str, Callable[[], Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]]:
    import tokenpos.torch as tpt

    def parts(p: float) -> tuple[object, object, torch.Tensor]:
        torch.manual_seed(0)
        emb = tpt.TransformerEmbedding(V, 4 * DH, 16, positional="learned", dropout=p, seed=0, device="cuda").train()
        rope = tpt.RotaryEmbedding(DH, device="cuda")
        wq = torch.randn(4 * DH, 4 * DH, device="cuda", requires_grad=True)
        return emb, rope, wq

    def full(p: float, return_x: bool) -> Callable[[], Callable]:
        def build() -> Callable:
            emb, rope, wq = parts(p)

            def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                x = emb(ids)                                                   # type: ignore[operator]
                q = (x @ wq).view(B, L, 4, DH).transpose(1, 2)
                q, k = rope.apply(q, q)                                        # type: ignore[attr-defined]
                loss = tpt.scaled_dot_product_attention(q, k, q).pow(2).sum()
                return (x if return_x else loss.detach()), loss
            return forward
        return build

    def embedding_only() -> Callable:
        emb, _, _ = parts(0.5)

        def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = emb(ids)                                                       # type: ignore[operator]
            return x, x.pow(2).sum()
        return forward

    def plain_torch() -> Callable:
        torch.manual_seed(0)
        w = torch.randn(V, 4 * DH, device="cuda", requires_grad=True)
        table = torch.randn(16, 4 * DH, device="cuda", requires_grad=True)
        wq = torch.randn(4 * DH, 4 * DH, device="cuda", requires_grad=True)
        inv = 10000.0 ** (-torch.arange(0, DH, 2, device="cuda", dtype=torch.float32) / DH)
        ang = torch.outer(torch.arange(L, device="cuda", dtype=torch.float32), inv)
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

        def rot(x: torch.Tensor) -> torch.Tensor:
            h = x.shape[-1] // 2
            return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

        def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = F.dropout(F.embedding(ids, w) + table[:L], 0.5, training=True)
            q = (x @ wq).view(B, L, 4, DH).transpose(1, 2)
            q = rot(q)
            return x, F.scaled_dot_product_attention(q, q, q, is_causal=True).pow(2).sum()
        return forward

    return {"tokenpos step (the test)": full(0.5, True), "tokenpos step, no dropout": full(0.0, True),
            "tokenpos step, x not returned": full(0.5, False), "tokenpos embedding only": embedding_only,
            "plain torch twin (control)": plain_torch}


def main() -> int:
    if not torch.cuda.is_available():
        print("exp_gpu_reduce_overhead: needs CUDA", file=sys.stderr)
        return 2
    ids = torch.randint(0, V, (B, L), device="cuda")
    for name, build in variants().items():
        torch._dynamo.reset()
        compiled = torch.compile(build(), mode="reduce-overhead", fullgraph=True)
        status = "ok"
        for i in range(6):
            try:
                torch.compiler.cudagraph_mark_step_begin()
                x, loss = compiled(ids)
                loss.backward()
                (x == 0).float().mean().item()
            except Exception as exc:                                          # reported per variant
                status = f"iteration {i}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                break
        print(f"{name:34s} {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
