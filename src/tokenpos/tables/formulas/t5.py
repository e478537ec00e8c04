"""T5 relative position buckets (Raffel et al. 2020) and the bias gather, as in HF ``T5Attention``.

Shapes: H heads, NB num_buckets, Lq query length, Lk key length, ``...`` any.

``relative_position = key_pos - query_pos``. Half of the buckets (per direction when
bidirectional) are exact distances 0..max_exact-1; the rest grow logarithmically up to
``max_distance``, beyond which every distance shares the last bucket. When not bidirectional,
keys after the query (positive relative positions) all fall into bucket 0.
With a cache (Lq < Lk) query i sits at key position ``Lk - Lq + i`` (HF's ``past_seen_tokens``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tokenpos.tables.checks.bias import bias_length_message, check_t5_config
from tokenpos.tables.checks.validation import check_int
from tokenpos.tables.errors import ConfigError


def t5_relative_bucket(relative_position: Any, *, bidirectional: bool = True, num_buckets: int = 32,
                       max_distance: int = 128) -> np.ndarray:
    """HF ``T5Attention._relative_position_bucket``: integer relative positions (...) -> buckets (...), int64.

    The log part is computed in float32, as HF does (``relative_position.float()``), so the
    bucket boundaries are HF's exactly.
    """
    num_buckets, max_distance, bidirectional = check_t5_config(num_buckets, max_distance, bidirectional)
    rel = np.asarray(relative_position)
    if rel.dtype == np.bool_ or not np.issubdtype(rel.dtype, np.integer):
        raise ConfigError(f"relative_position must be integers, got dtype {rel.dtype}")
    rel = rel.astype(np.int64)
    buckets = np.zeros(rel.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(np.int64) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2                                            # rel is now >= 0
    is_small = rel < max_exact
    with np.errstate(divide="ignore"):
        scaled = (np.log(rel.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact))
    large = max_exact + np.where(is_small, 0, scaled).astype(np.int64)     # trunc toward zero, like .to(long)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, rel, large)


def resolve_query_offset(q_len: int, k_len: int, query_offset: int | None = None) -> int:
    """The key position of query 0: ``query_offset``, or ``Lk - Lq`` when None (needs Lq <= Lk)."""
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = check_int("k_len", k_len, minimum=0)
    if query_offset is None:
        if q_len > k_len:
            raise ConfigError(bias_length_message(q_len, k_len))
        return k_len - q_len
    return check_int("query_offset", query_offset, minimum=0)


def t5_relative_positions(q_len: int, k_len: int, query_offset: int | None = None) -> np.ndarray:
    """``key_pos - query_pos`` with query i at ``query_offset + i`` (default Lk - Lq): (Lq, Lk) int64."""
    query_offset = resolve_query_offset(q_len, k_len, query_offset)
    context = np.arange(q_len, dtype=np.int64)[:, None] + query_offset
    memory = np.arange(k_len, dtype=np.int64)[None, :]
    return memory - context


def t5_bucket_matrix(q_len: int, k_len: int, *, bidirectional: bool = True, num_buckets: int = 32,
                     max_distance: int = 128, query_offset: int | None = None) -> np.ndarray:
    """The bucket of every (query, key) pair: (Lq, Lk) int64."""
    rel = t5_relative_positions(q_len, k_len, query_offset)
    return t5_relative_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)


def t5_bias(weight: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Gather the bias: weight (NB, H), buckets (Lq, Lk) -> (H, Lq, Lk) (HF's ``compute_bias`` without batch)."""
    return np.moveaxis(np.asarray(weight)[buckets], -1, 0)


def t5_bias_backward(grad_bias: np.ndarray, buckets: np.ndarray, num_buckets: int) -> np.ndarray:
    """Gradient of :func:`t5_bias` w.r.t. the weight: grad (H, Lq, Lk) -> (NB, H), summed per bucket."""
    grad = np.asarray(grad_bias)
    flat_buckets = np.asarray(buckets).reshape(-1)                         # (Lq*Lk,)
    cols = [np.bincount(flat_buckets, weights=g.reshape(-1), minlength=num_buckets) for g in grad]
    return np.stack(cols, axis=-1).astype(grad.dtype, copy=False)          # (NB, H)
