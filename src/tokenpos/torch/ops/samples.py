"""``samples()``: (op, args, kwargs) triples covering every tokenpos op, for ``torch.library.opcheck``.

float32 and float64; with and without requires_grad; dropout on and off; table on and off;
padding_idx; both RoPE layouts, partial rotary dims and per-batch cos/sin.
"""

from collections.abc import Iterator
from typing import Any

import torch

from tokenpos.torch.ops.embedding import embedding, embedding_backward
from tokenpos.torch.ops.rope import rope, rope_qk


def _rope_tables(batch: int | None, L: int, F: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (L, F) if batch is None else (batch, L, F)
    angles = torch.rand(shape, generator=gen, dtype=torch.float64) * 6.0
    return torch.cos(angles), torch.sin(angles)


def samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """Yield ``(op, args, kwargs)`` for every op, on ``device``, from a fixed seed."""
    gen = torch.Generator().manual_seed(0)
    V, D, P, B, L = 11, 6, 9, 2, 5
    for dtype in (torch.float32, torch.float64):
        for grad in (False, True):
            def rand(*shape: int, g: bool = grad, dt: torch.dtype = dtype) -> torch.Tensor:
                return torch.randn(shape, generator=gen, dtype=dt).to(device).requires_grad_(g)

            ids = torch.randint(0, V, (B, L), generator=gen).to(device)
            pos = torch.randint(0, P, (L,), generator=gen).to(device)
            seed = torch.tensor(1234 + int(grad), dtype=torch.int64, device=device)
            for with_table in (False, True):
                for p in (0.0, 0.25):
                    table = rand(P, D) if with_table else None
                    yield embedding, (rand(V, D), ids, table, pos if with_table else None, 1.5, p, seed, 3), {}
            full_pos = torch.randint(0, P, (B, L), generator=gen).to(device)
            yield embedding, (rand(V, D), ids[0], rand(P, D), full_pos[0], 1.0, 0.1, seed, -1), {}
            yield embedding_backward, (rand(B, L, D), ids, pos, V, P, 2.0, 0.25, seed, 0), {}
            yield embedding_backward, (rand(B, L, D), ids, None, V, 0, 1.0, 0.0, seed, -1), {}
            for interleaved in (False, True):
                for batch_tables, F in ((None, 4), (B, 4), (None, 3)):
                    cos, sin = _rope_tables(batch_tables, L, F, gen)
                    cos, sin = cos.to(device), sin.to(device)
                    yield rope, (rand(B, 3, L, 8), cos, sin, interleaved), {}
                    yield rope_qk, (rand(B, 3, L, 8), rand(B, 1, L, 8), cos, sin, interleaved), {}
