"""ALiBi (Press et al. 2022): per-head slopes and the linear distance bias, in float64.

Shapes: H heads, Lq query length, Lk key length.

Slopes: for H a power of two, ``m_h = 2 ** (-8 (h + 1) / H)``, h = 0..H-1. Otherwise take the
2^k = largest power of two below H, its slopes, then every other slope of 2^(k+1) heads
(``2 ** (-4 (2j + 1) / 2^k)``, j = 0..H - 2^k - 1), as the paper's code and HF Bloom do.

Bias: ``bias[h, i, j] = -m_h * |q_pos(i) - j|`` with ``q_pos(i) = Lk - Lq + i`` (with a KV cache
the Lq queries are the last Lq of the Lk keys). Causal masking is the attention's job. For causal
attention (j <= q_pos) this equals HF Bloom's ``m_h * j`` minus a per-row constant ``m_h * q_pos``,
which softmax ignores.
"""

from __future__ import annotations

import math

import numpy as np

from tokenpos.tables.checks.bias import bias_length_message
from tokenpos.tables.checks.validation import check_int
from tokenpos.tables.errors import ConfigError


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The ALiBi slope of each head: shape (H,), float64, decreasing, all in (0, 1)."""
    num_heads = check_int("num_heads", num_heads, minimum=1)
    closest = 2 ** math.floor(math.log2(num_heads))

    def geometric(n: int) -> np.ndarray:          # 2 ** (-8 k / n) for k = 1..n
        return np.power(2.0, -8.0 * np.arange(1, n + 1, dtype=np.float64) / n)

    slopes = geometric(closest)
    if closest != num_heads:
        extra = geometric(2 * closest)[0::2][: num_heads - closest]
        slopes = np.concatenate([slopes, extra])
    return slopes


def alibi_distances(q_len: int, k_len: int) -> np.ndarray:
    """``|q_pos(i) - j|`` with ``q_pos(i) = Lk - Lq + i``: shape (Lq, Lk), float64."""
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = check_int("k_len", k_len, minimum=0)
    if q_len > k_len:
        raise ConfigError(bias_length_message(q_len, k_len))
    q_pos = np.arange(k_len - q_len, k_len, dtype=np.float64)[:, None]
    return np.abs(q_pos - np.arange(k_len, dtype=np.float64)[None, :])


def alibi_bias(num_heads: int, q_len: int, k_len: int) -> np.ndarray:
    """``-slope_h * |q_pos(i) - j|``: shape (H, Lq, Lk), float64."""
    return -alibi_slopes(num_heads)[:, None, None] * alibi_distances(q_len, k_len)[None]
