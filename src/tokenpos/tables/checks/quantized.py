"""The refusal of an 8-bit table (``weight_dtype`` int8 / float8_e4m3fn in either backend), written once: what a
frozen, inference-only quantised table cannot do (a backward, the tied loss, a resize, a sparse gradient)."""

from __future__ import annotations

from typing import Any

from tokenpos.tables.errors import ConfigError


def quantized_refusal(layer: Any, what: str, weight_dtype: Any = None) -> ConfigError:
    """The ConfigError of ``what`` asked of an 8-bit ``layer`` (a layer, its class or its name), naming the layer,
    its weight dtype (``weight_dtype``, else the layer's own) and what is expected instead."""
    name = layer if isinstance(layer, str) else getattr(layer, "__name__", type(layer).__name__)
    wd = getattr(layer, "weight_dtype", None) if weight_dtype is None else weight_dtype
    return ConfigError(f"{what} is not available for an 8-bit {name} (weight_dtype={wd}): the 8-bit table is "
                       f"frozen and inference only; expected a float table (weight_dtype=None)")
