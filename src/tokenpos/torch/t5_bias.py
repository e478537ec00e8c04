"""T5RelativePositionBias for the torch backend: a learned bias per (relative-position bucket, head).

Shapes: NB num_buckets, H heads, Lq query length, Lk key length (query i sits at key position
``Lk - Lq + i`` by default, HF's ``past_seen_tokens``).

Buckets are constant once ``|key_pos - query_pos| >= max_distance``, so the non-persistent buffer
``bucket_table`` (2 * max_distance + 1,) holds the bucket of every relative position in
[-max_distance, max_distance], computed by ``tokenpos.tables.t5_relative_bucket`` (HF's formula,
float32 log as in HF). forward clamps the relative positions into that range and gathers twice:
no data-dependent branch, so it runs under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.bias import check_t5_config
from tokenpos.tables.checks.validation import check_choice, check_positive_int
from tokenpos.tables.formulas.init import INIT_SCHEMES
from tokenpos.tables.formulas.t5 import resolve_query_offset, t5_relative_bucket
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._init import fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule


class T5RelativePositionBias(TokenposModule):
    """HF ``T5Attention.relative_attention_bias`` + ``compute_bias``.

    Args:
        num_heads: H.
        bidirectional: True for encoders, False for causal decoders (HF: ``not is_decoder``).
        num_buckets, max_distance: HF's ``relative_attention_num_buckets`` / ``_max_distance``.
        init, std: weight init (``tables.init_weight``); seed / rng give the NumPy backend's numbers.
        device, dtype: factory kwargs.

    state_dict: ``weight`` (NB, H), the layout of HF's ``relative_attention_bias.weight``.

    Shape:
        forward(q_len, k_len) -> (H, Lq, Lk).
    """

    kind = "bias"
    name = "t5"

    def __init__(self, num_heads: int, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128,
                 init: str = "normal", std: float = 0.02, device: Any = None, dtype: Any = None,
                 seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_buckets, self.max_distance, self.bidirectional = check_t5_config(num_buckets, max_distance,
                                                                                  bidirectional)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        self.weight = nn.Parameter(torch.empty(self.num_buckets, self.num_heads, device=device,
                                               dtype=resolve_dtype(dtype)))
        self.bucket_table: torch.Tensor
        self.register_buffer("bucket_table", torch.empty(2 * self.max_distance + 1, dtype=torch.int64,
                                                         device=self.weight.device), persistent=False)
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the weight (seed/rng: the NumPy numbers; else seeded from torch's generator) and refill the
        bucket table (a layer made on the meta device, then ``to_empty``, held uninitialised buckets)."""
        fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator))
        if not self.bucket_table.is_meta:
            table = t5_relative_bucket(np.arange(-self.max_distance, self.max_distance + 1),
                                       bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                       max_distance=self.max_distance)
            with torch.no_grad():
                self.bucket_table.copy_(torch.from_numpy(table))

    def buckets(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> torch.Tensor:
        """The bucket of each (query, key) pair: (Lq, Lk) int64 on the weight's device."""
        offset = resolve_query_offset(q_len, k_len, query_offset)
        dev = self.bucket_table.device
        rel = torch.arange(k_len, device=dev)[None, :] - (offset + torch.arange(q_len, device=dev))[:, None]
        return self.bucket_table[rel.clamp(-self.max_distance, self.max_distance) + self.max_distance]

    def forward(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> torch.Tensor:
        """The bias (H, Lq, Lk); ``query_offset`` (default Lk - Lq) is HF's ``past_seen_tokens``."""
        values = F.embedding(self.buckets(q_len, k_len, query_offset=query_offset), self.weight)   # (Lq, Lk, H)
        return values.permute(2, 0, 1)                                                           # (H, Lq, Lk)

    bias = forward

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}")
