"""Constructor and input checks of the xPos and 2-D RoPE layers, written once for both backends.

Shapes: B batch, N patches (or L positions), Dh head dim, R rotary dim, F rotated pairs.
2-D positions: (N, 2) or (B, N, 2) (row, col).

The NumPy and torch layers call these with the same arguments, so they accept and refuse the same
settings with the same messages and keep the same attribute values.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope2d import rope2d_inv_freq
from tokenpos.tables.rope_checks import check_rotary_dim
from tokenpos.tables.rope_state import rope_kwargs_from_hf_config
from tokenpos.tables.validation import check_float, check_int, check_start_pos_with_positions

_R = TypeVar("_R", bound="RopeFromHFConfig")


class RopeFromHFConfig:
    """``from_hf_config`` of the RotaryEmbedding layers of both backends (a mixin)."""

    @classmethod
    def from_hf_config(cls: type[_R], config: Any, *, layer_type: str | None = None, **kwargs: Any) -> _R:
        """Build from an HF config (``rope_parameters`` of transformers 5 or ``rope_scaling`` of 4).

        ``layer_type`` picks one entry of per-layer-type parameters (Gemma 3 / 4); see
        ``tokenpos.tables.rope_hf_config`` for every key read (a key that changes the rotation is
        honoured or refused, never ignored).
        """
        return cast(_R, cast(Any, cls)(**{**rope_kwargs_from_hf_config(config, layer_type=layer_type), **kwargs}))


def xpos_layer_args(head_dim: Any, rotary_dim: Any, scale_base: Any, center: Any, interleaved: Any, *,
                    bool_types: tuple[type, ...] = (bool,)) -> tuple[int, int, float, float | None, bool]:
    """``(head_dim, rotary_dim R, scale_base, center, interleaved)`` of an xPos layer, checked.

    ``bool_types``: the types ``interleaved`` may have (the NumPy layer also takes ``np.bool_``).
    """
    head_dim = check_int("head_dim", head_dim, minimum=2)
    rotary_dim = check_rotary_dim(head_dim, rotary_dim)
    scale_base = check_float("scale_base", scale_base, low=0.0, low_inclusive=False)
    center = None if center is None else check_float("center", center)
    if not isinstance(interleaved, bool_types):
        raise ConfigError(f"interleaved must be True or False, got {interleaved!r}")
    return head_dim, rotary_dim, scale_base, center, bool(interleaved)


def rope2d_layer_args(head_dim: Any, base: Any) -> tuple[int, float, np.ndarray, np.ndarray]:
    """``(head_dim, base, inv_freq (F,) float64, axis_of_freq (F,) int64)`` of a 2-D RoPE layer, checked."""
    head_dim, base = check_int("head_dim", head_dim, minimum=4), check_float("base", base, low=1.0)
    inv_freq, axis_map = rope2d_inv_freq(head_dim, base=base)           # checks head_dim % 4
    return head_dim, base, inv_freq, axis_map


def rope2d_args_from_hf_config(config: Any) -> tuple[int, float]:
    """``(head_dim, base)`` of an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "axial") != "axial" or set(params) - {"rope_type", "rope_theta"}:
        raise ConfigError(f"2-D RoPE reads rope_parameters {{'rope_type': 'axial', 'rope_theta'}}, got {params}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim), float(params.get("rope_theta", 10000.0))


def check_rope2d_positions_given(positions: Any, start_pos: Any) -> None:
    """2-D RoPE has no default positions: None is refused; given ones need ``start_pos`` None or 0."""
    if positions is None:
        raise ConfigError("2-D RoPE needs positions of shape (N, 2) or (B, N, 2) (row, col); got None")
    check_start_pos_with_positions(start_pos, positions, none_ok=True)


def check_rope2d_positions_shape(shape: tuple[int, ...], batch: int, length: int) -> None:
    """2-D positions of q (B, H, N, Dh): (N, 2), (1, N, 2) or (B, N, 2); else ``ConfigError``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3) or shape[-1] != 2 or shape[-2] != length or (
            len(shape) == 3 and shape[0] not in (1, batch)):
        raise ConfigError(f"positions must have shape ({length}, 2) or ({batch}, {length}, 2), got {shape}")
