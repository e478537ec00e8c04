"""The local lookup of a vocab-parallel shard: the one call into the token-embedding op.

Shapes: Vl local rows, D d_model, ids (...) already shifted into [0, Vl).

Kept in one function on purpose: when the token-embedding op becomes ``torch.ops.tokenpos.embedding``,
this is the line that changes. Today it is the path of ``tokenpos.torch.TokenEmbedding.lookup``: the
fused numba kernel for CPU float32/float64 tables (dense gradient), ``F.embedding`` times the scale
otherwise, so a shard's rows come out bit for bit as the one-process layer's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenpos.torch import _fused
from tokenpos.torch._checks import as_index


def local_lookup(weight: torch.Tensor, local_ids: torch.Tensor, scale: float,
                 padding_idx: int | None) -> torch.Tensor:
    """``weight[local_ids] * scale``: (Vl, D), ids (...) -> (..., D); no gradient to ``padding_idx``."""
    if _fused.fusable(weight) and local_ids.is_cpu and weight.is_contiguous():
        return _fused.embedding(weight, local_ids, scale=scale, padding_idx=padding_idx)
    out = F.embedding(as_index(local_ids), weight, padding_idx)                  # (..., D)
    return out * scale if scale != 1.0 else out
