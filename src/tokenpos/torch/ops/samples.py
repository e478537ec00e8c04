"""``samples()``: (op, args, kwargs) triples covering every tokenpos op, for ``torch.library.opcheck``.

float32 and float64; with and without requires_grad (RoPE's cos / sin too: learned frequencies);
dropout on and off; table on and off; padding_idx; both RoPE layouts, partial rotary dims, shared
(L, F) / (1, L, F) and per-batch (B, L, F) cos / sin, and a (P, F) table read at positions (L,) / (1, L) /
(B, L) (int64 and int32, strided, the (T, H, 1, Dh) view of a packed row; a sliced table); and inputs
of every stride the layers hand the ops: q / k as Hugging Face builds them
(``proj.view(B, L, H, Dh).transpose(1, 2)``), from a ``qk_layout="blhd"`` tensor, expanded over the
batch (stride 0), sliced from a wider (fused qkv) or strided tensor; strided, transposed and expanded
tables, ids and positions for the embedding.
"""

from collections.abc import Iterator
from typing import Any

import torch

from tokenpos.torch.ops.embedding import embedding, embedding_backward
from tokenpos.torch.ops.ngram import ngram_samples
from tokenpos.torch.ops.quantized import quantized_samples
from tokenpos.torch.ops.rope import rope, rope_backward, rope_qk, rope_qk_backward
from tokenpos.torch.ops.tied_loss import tied_cross_entropy, tied_cross_entropy_backward


def _rope_tables(batch: int | None, L: int, F: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (L, F) if batch is None else (batch, L, F)
    angles = torch.rand(shape, generator=gen, dtype=torch.float64) * 6.0
    return torch.cos(angles), torch.sin(angles)


def _positioned(B: int, L: int, P: int, F: int, gen: torch.Generator, tables: Any, device: Any
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(cos, sin, positions): a (P, F) table (and a sliced one) read at positions of every accepted
    shape, dtype and stride."""
    full = torch.randint(0, P, (B, 2 * L), generator=gen).to(device)
    cos, sin = tables(P, F)
    wide_c, wide_s = tables(P, F + 2)
    for pos in (full[0, :L], full[:1, :L], full[:, :L].contiguous(), full[:, ::2], full[:, :L].int()):
        yield cos, sin, pos
    yield wide_c.detach()[:, 1:F + 1].requires_grad_(cos.requires_grad), \
        wide_s.detach()[:, 1:F + 1].requires_grad_(sin.requires_grad), full[0, ::2]


def _strided_heads(kind: str, B: int, H: int, L: int, Dh: int, rand: Any) -> torch.Tensor:
    """A (B, H, L, Dh) input of ``kind``'s strides, as a leaf (requires_grad as ``rand`` makes it)."""
    if kind == "hf":                                                    # (B, L, H*Dh) projection, viewed
        x = rand(B, L, H * Dh).view(B, L, H, Dh).transpose(1, 2)
    elif kind == "blhd":
        x = rand(B, L, H, Dh).transpose(1, 2)
    elif kind == "expanded":                                            # stride 0 over the batch
        x = rand(1, H, L, Dh).expand(B, H, L, Dh)
    elif kind == "fused":                                               # a slice of a wider (qkv) tensor
        x = rand(B, H, L, Dh + 4)[..., 2:Dh + 2]
    else:                                                               # "strided": every other element
        x = rand(B, H, L, 2 * Dh)[..., ::2]
    return x.detach().requires_grad_(rand(1).requires_grad)


STRIDES = ("hf", "blhd", "expanded", "fused", "strided")


def samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """Yield ``(op, args, kwargs)`` for every op, on ``device``, from a fixed seed."""
    yield from _samples(device)
    yield from tied_loss_samples(device)
    yield from ngram_samples(device)
    yield from quantized_samples(device)


def _samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    gen = torch.Generator().manual_seed(0)
    V, D, P, B, L = 11, 6, 9, 2, 5
    for dtype in (torch.float32, torch.float64):
        for grad in (False, True):
            def rand(*shape: int, g: bool = grad, dt: torch.dtype = dtype) -> torch.Tensor:
                return torch.randn(shape, generator=gen, dtype=dt).to(device).requires_grad_(g)

            def tables(batch: int | None, F: int, g: bool = grad, rows: int = L) -> tuple[torch.Tensor, torch.Tensor]:
                cos, sin = _rope_tables(batch, rows, F, gen)
                return cos.to(device).requires_grad_(g), sin.to(device).requires_grad_(g)

            def pos_table(rows: int, F: int) -> tuple[torch.Tensor, torch.Tensor]:
                return tables(None, F, rows=rows)

            ids = torch.randint(0, V, (B, L), generator=gen).to(device)
            pos = torch.randint(0, P, (L,), generator=gen).to(device)
            seed = torch.tensor(1234 + int(grad), dtype=torch.int64, device=device)
            for with_table in (False, True):
                for p in (0.0, 0.25):
                    table = rand(P, D) if with_table else None
                    yield embedding, (rand(V, D), ids, table, pos if with_table else None, 1.5, p, seed, 3), {}
            full_pos = torch.randint(0, P, (B, L), generator=gen).to(device)
            yield embedding, (rand(V, D), ids[0], rand(P, D), full_pos[0], 1.0, 0.1, seed, -1), {}
            wide_w = rand(V, 2 * D).detach()[:, ::2].requires_grad_(grad)          # strided rows
            wide_t = rand(P, D + 3).detach()[:, 1:D + 1].requires_grad_(grad)      # a slice of wider rows
            yield embedding, (wide_w, ids.t().contiguous().t(), wide_t, pos.expand(B, L), 1.0, 0.0, seed, 0), {}
            yield embedding, (wide_w, ids[:1].expand(B, L), wide_t, full_pos.t().contiguous().t(), 2.0, 0.25, seed,
                              -1), {}
            yield embedding_backward, (rand(B, L, D), ids, pos, V, P, 2.0, 0.25, seed, 0), {}
            yield embedding_backward, (rand(B, L, D), ids, None, V, 0, 1.0, 0.0, seed, -1), {}
            yield embedding_backward, (rand(L, B, D).detach().transpose(0, 1).requires_grad_(grad),
                                       ids.t().contiguous().t(), pos, V, P, 1.0, 0.0, seed, -1), {}
            for interleaved in (False, True):
                for batch_tables, F in ((None, 4), (B, 4), (None, 3), (1, 2)):
                    cos, sin = tables(batch_tables, F)
                    yield rope, (rand(B, 3, L, 8), cos, sin, interleaved), {}
                    yield rope_qk, (rand(B, 3, L, 8), rand(B, 1, L, 8), cos, sin, interleaved), {}
                for cos, sin, pos in _positioned(B, L, P, 3, gen, pos_table, device):      # tables read by position
                    yield rope, (rand(B, 3, L, 8), cos, sin, interleaved, pos), {}
                    yield rope_qk, (rand(B, 3, L, 8), rand(B, 1, L, 8), cos, sin, interleaved, pos), {}
                cos, sin = pos_table(P, 4)                                      # a packed row, token-major
                token = torch.randint(0, P, (B * L, 1), generator=gen).to(device)
                yield rope_qk, (rand(B * L, 2, 1, 8), rand(B * L, 2, 1, 8), cos, sin, interleaved, token), {}
                if interleaved:                                             # the transposes
                    cos, sin = tables(None, 3)
                    yield rope_backward, (rand(B, 3, L, 8), cos, sin, interleaved), {}
                    yield rope_qk_backward, (rand(B, 3, L, 8), rand(B, 1, L, 8), cos, sin, interleaved), {}
                    cos, sin = pos_table(P, 3)
                    pos = torch.randint(0, P, (B, L), generator=gen).to(device)
                    yield rope_backward, (rand(B, 3, L, 8), cos, sin, interleaved, pos), {}
                    yield rope_qk_backward, (rand(B, 3, L, 8), rand(B, 1, L, 8), cos, sin, interleaved, pos), {}
                    continue
                for kind in STRIDES:
                    cos, sin = tables(B if kind == "hf" else None, 3)
                    q = _strided_heads(kind, B, 4, L, 8, rand)
                    k = _strided_heads(kind, B, 2, L, 8, rand)
                    yield rope, (q, cos, sin, interleaved), {}
                    yield rope_qk, (q, k, cos, sin, interleaved), {}
                    cos, sin = pos_table(P, 3)
                    yield rope_qk, (q, k, cos, sin, interleaved, full_pos), {}


def tied_loss_samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """The tied loss ops: float32 / float64, with and without grad, every reduction, ignored targets,
    label smoothing, soft-capping, several chunks and one, (B, L) and (N,) tokens, a strided h."""
    gen = torch.Generator().manual_seed(1)
    V, D, B, L = 13, 6, 2, 5
    for dtype in (torch.float32, torch.float64):
        for grad in (False, True):
            def rand(*shape: int, g: bool = grad, dt: torch.dtype = dtype) -> torch.Tensor:
                return torch.randn(shape, generator=gen, dtype=dt).to(device).requires_grad_(g)

            targets = torch.randint(0, V, (B, L), generator=gen)
            targets[0, 1] = -100
            targets = targets.to(device)
            for reduction, eps, cap, chunk in (("mean", 0.0, None, None), ("sum", 0.1, 2.0, 3),
                                               ("none", 0.2, None, 4), ("mean", 0.1, 5.0, 1)):
                for with_grad in (False, True) if reduction != "none" else (False,):
                    yield tied_cross_entropy, (rand(B, L, D), rand(V, D), targets, -100, eps, reduction, cap, chunk,
                                               with_grad), {}
            strided = rand(B, L, 2 * D).detach()[..., ::2].requires_grad_(grad)
            yield tied_cross_entropy, (strided, rand(V, D), targets.reshape(-1)[:B * L].reshape(B, L), -100, 0.0,
                                       "sum", None, 2, grad), {}
            all_ignored = torch.full((L,), 3, device=device)
            yield tied_cross_entropy, (rand(L, D), rand(V, D), all_ignored, 3, 0.0, "mean", None, None, grad), {}
            if not grad:
                lse = torch.randn(B * L, generator=gen, dtype=dtype).to(device) + 3.0
                for reduction, shape in (("mean", ()), ("none", (B, L))):
                    yield tied_cross_entropy_backward, (rand(*shape), rand(B, L, D), rand(V, D), targets, lse, -100,
                                                        0.1, reduction, 2.0, 3), {}
