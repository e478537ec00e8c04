"""The packed batch of the tests/torch/test_packed_*.py files: four documents of unequal lengths as one
row of T tokens with ``cu_seqlens``, and the same documents padded in an (N, L) batch.

Shapes: N documents, L the longest, T tokens; MASK (N, L) marks the real tokens of the padded batch,
in the packed row's order.
"""

from __future__ import annotations

import numpy as np
import torch

LENGTHS = [3, 5, 1, 4]
CU = torch.tensor([0, *np.cumsum(LENGTHS)], dtype=torch.int32)
T, L, N = int(CU[-1]), max(LENGTHS), len(LENGTHS)
MASK = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]               # (N, L) real tokens


def pad(x: torch.Tensor) -> torch.Tensor:
    """(T, ...) packed -> (N, L, ...), zeros at the pads."""
    out = x.new_zeros((N, L, *x.shape[1:]))
    out[MASK] = x
    return out


def pad_heads(x: torch.Tensor) -> torch.Tensor:
    """(T, H, Dh) packed -> (N, H, L, Dh), zeros at the pads."""
    return pad(x).transpose(1, 2)


def unpad_heads(x: torch.Tensor) -> torch.Tensor:
    """(N, H, L, Dh) -> (T, H, Dh): the real tokens, in the packed row's order."""
    return x.transpose(1, 2)[MASK]
