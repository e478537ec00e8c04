"""T5RelativePositionBias for the NumPy backend: a learned bias per (relative-position bucket, head).

Shapes: NB num_buckets, H heads, Lq query length, Lk key length (query i sits at key position
``Lk - Lq + i`` by default, HF's ``past_seen_tokens``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.bias import check_t5_config
from tokenpos.tables.checks.validation import check_dtype, check_grad, check_positive_int
from tokenpos.tables.formulas.init import init_weight, resolve_rng
from tokenpos.tables.formulas.t5 import t5_bias, t5_bias_backward, t5_bucket_matrix


class T5RelativePositionBias(Module):
    """HF ``T5Attention.relative_attention_bias`` + ``compute_bias``, with a hand-written backward.

    Args:
        num_heads: H.
        bidirectional: True for encoders, False for causal decoders (HF: ``not is_decoder``).
        num_buckets, max_distance: HF's ``relative_attention_num_buckets`` / ``_max_distance``.
        init, std: weight init (``tables.init_weight``); dtype, seed, rng as for every layer.

    Attributes:
        weight: Parameter (NB, H), state_dict key ``weight`` (HF's ``relative_attention_bias.weight``).

    Shape:
        forward(q_len, k_len) -> (H, Lq, Lk); backward(grad (H, Lq, Lk)) accumulates into weight.grad.
    """

    kind = "bias"
    name = "t5"

    def __init__(self, num_heads: int, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128,
                 init: str = "normal", std: float = 0.02, dtype: Any = np.float32, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_buckets, self.max_distance, self.bidirectional = check_t5_config(num_buckets, max_distance,
                                                                                  bidirectional)
        self.init, self.std = init, std
        self.dtype = check_dtype("dtype", dtype)
        self.weight = Parameter(np.empty((self.num_buckets, self.num_heads), self.dtype))     # (NB, H)
        self.reset_parameters(rng=resolve_rng(seed, rng))

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        self.weight.data[...] = init_weight(self.weight.data.shape, self.init, std=self.std, rng=resolve_rng(seed, rng))
        self.weight.zero_grad()

    def buckets(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> np.ndarray:
        """The bucket of each (query, key) pair: (Lq, Lk) int64."""
        return t5_bucket_matrix(q_len, k_len, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                max_distance=self.max_distance, query_offset=query_offset)

    def forward(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> np.ndarray:
        """The bias (H, Lq, Lk). ``query_offset`` (default Lk - Lq) is HF's ``past_seen_tokens``.

        Stateless: :meth:`backward` recomputes the buckets from the gradient's shape.
        """
        return t5_bias(self.weight.data, self.buckets(q_len, k_len, query_offset=query_offset))

    bias = forward

    def backward(self, grad_bias: Any, *, query_offset: int | None = None) -> None:
        """Accumulate d(loss)/d(weight) from grad_bias (H, Lq, Lk) (pass the forward's query_offset)."""
        grad = check_grad("grad_bias", grad_bias, (self.num_heads, "Lq", "Lk"))
        buckets = self.buckets(grad.shape[1], grad.shape[2], query_offset=query_offset)
        self.weight.accumulate(t5_bias_backward(grad, buckets, self.num_buckets))
        return None

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}")
