"""The local lookup of a vocab-parallel shard: the one call into the token-embedding op.

Shapes: Vl local rows, D d_model, ids (...) already shifted into [0, Vl).

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
