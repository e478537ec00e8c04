"""The checks every ``MRotaryEmbedding`` constructor makes, written once for both backends.

Shapes: Dh head dim, F = Dh / 2 frequencies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.mrope import MROPE_LAYOUTS, mrope_axis_map
from tokenpos.tables.rope import check_qk_layout, rope_inv_freq
from tokenpos.tables.rope_scaling import LENGTH_DEPENDENT_TYPES, normalize_rope_scaling
from tokenpos.tables.validation import check_choice, check_int

# length-dependent scalings keep per-call state; no M-RoPE model uses them
MROPE_REFUSED_TYPES = LENGTH_DEPENDENT_TYPES


class MRopeSettings:
    """Frequencies (F,) float64, attention factor and the frequency -> axis map of an M-RoPE layer."""

    def __init__(self, head_dim: Any, *, base: Any, max_seq_len: Any, scaling: Any, mrope_section: Any,
                 mrope_layout: Any, qk_layout: Any, num_heads: Any) -> None:
        self.head_dim = check_int("head_dim", head_dim, minimum=2)
        if self.head_dim % 2:
            raise ConfigError(f"M-RoPE needs an even head_dim, got {self.head_dim}")
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        params = normalize_rope_scaling(scaling, max_position_embeddings=self.max_seq_len)
        if params["rope_type"] in MROPE_REFUSED_TYPES:
            raise ConfigError(f"M-RoPE supports static scalings; got rope_type {params['rope_type']!r} "
                              f"(expected one not in {list(MROPE_REFUSED_TYPES)})")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError("M-RoPE with a partial rotary factor is not supported; expected 1.0, got "
                              f"{params['partial_rotary_factor']}")
        self.scaling = params
        inv, self.attention_factor = rope_inv_freq(self.head_dim, base=base, scaling=params,
                                                   max_position_embeddings=self.max_seq_len)
        self.inv_freq: np.ndarray = inv
        self.base = float(params.get("rope_theta", base))
        self.mrope_layout = check_choice("mrope_layout", mrope_layout, MROPE_LAYOUTS)
        self.mrope_section = [int(s) for s in mrope_section] if isinstance(mrope_section, (list, tuple)) \
            else mrope_section
        self.axis_map = mrope_axis_map(mrope_section, inv.shape[0], layout=self.mrope_layout)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)


def mrope_positions_message(shape: tuple[int, ...], batch: int, length: int) -> str:
    return (f"M-RoPE positions must have shape (3, {batch} or 1, {length}), ({batch} or 1, {length}) or "
            f"({length},), got {tuple(int(s) for s in shape)}")


def check_mrope_positions_shape(shape: tuple[int, ...], batch: int, length: int) -> None:
    """M-RoPE positions of q (B, H, L, Dh): (3, B | 1, L), (B | 1, L) or (L,); else ``ConfigError``
    (:func:`mrope_positions_message`). Both backends check the shape with this, after the values."""
    shape = tuple(int(s) for s in shape)
    ok = shape[-1:] == (length,) and (len(shape) == 1 or (len(shape) == 2 and shape[0] in (1, batch)) or (
        len(shape) == 3 and shape[0] == 3 and shape[1] in (1, batch)))
    if not ok:
        raise ConfigError(mrope_positions_message(shape, batch, length))
