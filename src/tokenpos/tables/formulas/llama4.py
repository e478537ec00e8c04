"""Llama 4 (iRoPE): which layers rotate (the NoPE layer pattern) and the attention temperature of NoPE layers.

Shapes: L length, ``...`` any leading.

- ``no_rope_layers``: HF's list per layer, 1 = the layer uses RoPE, 0 = NoPE. When absent, HF builds it
  as ``int((i + 1) % no_rope_layer_interval != 0)``: every ``interval``-th layer has no RoPE.
- temperature (Nakanishi 2025, "Scalable-Softmax"; HF ``attn_temperature_tuning``): in NoPE layers each
  query at position n is multiplied by ``log1p(floor((n + 1) / floor_scale)) * attn_scale + 1`` before the
  logits (n counts from 0, including the KV cache). The factor is 1 below ``floor_scale - 1`` and grows
  like the log of the length. Computed in float64 (exact for every int64 position HF's float32 allows).

Reading both from a Llama4TextConfig: ``tables.hf.models.llama4_kwargs_from_hf_config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.attention import check_temperature
from tokenpos.tables.checks.validation import check_int, check_positions, check_start_pos_with_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.attention import resolve_query_start


def llama4_rope_layers(num_layers: int, *, no_rope_layers: Any = None, interval: int = 4) -> list[bool]:
    """Per layer: True = RoPE, False = NoPE, as HF ``Llama4TextConfig`` builds ``no_rope_layers``."""
    num_layers = check_int("num_hidden_layers", num_layers, minimum=1)
    if no_rope_layers:
        flags = list(no_rope_layers)
        if len(flags) != num_layers or any(f not in (0, 1, True, False) for f in flags):
            raise ConfigError(f"no_rope_layers must be {num_layers} flags of 0/1 (1 = RoPE), got {no_rope_layers!r}")
        return [bool(f) for f in flags]
    interval = check_int("no_rope_layer_interval", interval, minimum=1)
    return [(i + 1) % interval != 0 for i in range(num_layers)]


def llama4_attn_scales(positions: Any, *, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> np.ndarray:
    """Per-query temperature ``log1p(floor((n + 1) / floor_scale)) * attn_scale + 1`` -> float64, positions' shape."""
    floor_scale, attn_scale = check_temperature((floor_scale, attn_scale))
    pos = check_positions(positions).astype(np.float64)
    return np.log1p(np.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0


def query_temperature(attn_temperature: Any, positions: Any, start_pos: int | None, lq: int, lk: int,
                      dtype: Any = np.float64) -> np.ndarray:
    """The attention functions' ``attn_temperature`` option: scales (B|1, 1, Lq, 1) in ``dtype``.

    Query positions: ``positions`` ((Lq,) or (B, Lq)) when given, else the attention's query start
    (``start_pos``, default Lk - Lq: the queries are the last Lq keys) + arange(Lq). With ``positions``
    given, ``start_pos`` must be None or 0 (ConfigError otherwise: it would be ignored), as in attention.
    """
    floor_scale, attn_scale = check_temperature(attn_temperature)
    check_start_pos_with_positions(start_pos, positions, none_ok=True)
    if positions is None:
        pos = resolve_query_start(start_pos, lq, lk) + np.arange(lq, dtype=np.int64)
    else:
        pos = check_positions(np.asarray(positions.cpu() if hasattr(positions, "cpu") else positions))
        if pos.shape[-1] != lq or pos.ndim > 2:
            raise ConfigError(f"positions for attn_temperature must have shape ({lq},) or (B, {lq}), "
                              f"got {tuple(pos.shape)}")
    s = llama4_attn_scales(pos, floor_scale=floor_scale, attn_scale=attn_scale)
    s = s.reshape(1, 1, lq, 1) if s.ndim == 1 else s[:, None, :, None]
    return s.astype(dtype)
