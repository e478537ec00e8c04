"""The local lookup of a row-sharded table: the one call into the token-embedding op.

Shapes: Vl local rows, D the row width (d_model, or a hashed table's head_dim), ids (...): local ids already
shifted into [0, Vl) (:func:`local_lookup`), or rows of the whole table (:func:`masked_lookup`).

Kept in one function: the shard's rows go through the same ``tokenpos::embedding`` op as
``tokenpos.torch.TokenEmbedding`` (the fused numba kernel for CPU float32/float64, Triton on CUDA,
plain torch elsewhere; dense gradient, none to ``padding_idx``), so a shard's rows come out bit for
bit as the one-process layer's.
"""

from __future__ import annotations

import torch

from tokenpos.torch.ops import embed


def local_lookup(weight: torch.Tensor, local_ids: torch.Tensor, scale: float,
                 padding_idx: int | None) -> torch.Tensor:
    """``weight[local_ids] * scale``: (Vl, D), ids (...) -> (..., D); no gradient to ``padding_idx``."""
    return embed(weight, local_ids, scale=scale, padding_idx=-1 if padding_idx is None else padding_idx)


def masked_lookup(weight: torch.Tensor, ids: torch.Tensor, start: int, scale: float,
                  padding_idx: int | None) -> torch.Tensor:
    """This shard's part of a lookup in the whole table: weight (Vl, D) holds rows [start, start + Vl), ids (...)
    are rows of the whole table -> (..., D): ``weight[ids - start] * scale`` where the shard owns the row, zero
    elsewhere (another rank owns it). ``padding_idx``: a local row. Summed over the ranks, each row comes from
    exactly one of them."""
    local = ids.long() - start                                               # (...), a fresh tensor
    owned = (local >= 0) & (local < weight.shape[0])                         # (...)
    local.masked_fill_(~owned, 0)
    part = local_lookup(weight, local, scale, padding_idx)                   # (..., D), a fresh tensor
    return part.masked_fill_(~owned.unsqueeze(-1), 0.0)                      # in place: its backward saves no output
