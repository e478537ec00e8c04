"""Checks and messages of the attention-bias schemes (ALiBi, T5, KERPLE, FIRE), shared by both backends.

Shapes: Lq query length, Lk key length; bias schemes put the Lq queries at the last Lq of the Lk key
positions, so they need Lq <= Lk. Messages say what, got, expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_float, check_int
from tokenpos.tables.errors import ConfigError


def bias_length_message(q_len: int, k_len: int) -> str:
    """The shared message for a query longer than its keys (bias schemes need Lq <= Lk)."""
    return (f"q_len {int(q_len)} is greater than k_len {int(k_len)}; expected q_len <= k_len "
            f"(the queries are the last q_len of the k_len key positions)")


def check_t5_config(num_buckets: Any, max_distance: Any, bidirectional: Any) -> tuple[int, int, bool]:
    """Validate the T5 bucket settings; returns them as (int, int, bool)."""
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise ConfigError(f"bidirectional must be True or False, got {bidirectional!r}")
    num_buckets = check_int("num_buckets", num_buckets, minimum=4 if bidirectional else 2)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = check_int("max_distance", max_distance, minimum=1)
    if max_distance <= max_exact:
        raise ConfigError(f"max_distance must be > {max_exact} (the exact buckets) for num_buckets={num_buckets}, "
                          f"got {max_distance}")
    return num_buckets, max_distance, bool(bidirectional)


def check_kerple_eps(eps: Any) -> float:
    """KERPLE's clamp floor: a finite float > 0."""
    return check_float("eps", eps, low=0.0, low_inclusive=False)
