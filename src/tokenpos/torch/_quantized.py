"""8-bit tables in the torch layers: the ``weight_dtype`` setting, the stored parameters, quantising a float table
and loading a float ``state_dict`` into an 8-bit layer.

A layer built with ``weight_dtype=torch.int8`` or ``torch.float8_e4m3fn`` holds ``weight`` (V, C) of that dtype
and ``weight_scale`` (V,) of the layer's float ``dtype``, both frozen parameters (``requires_grad=False``: the
state_dict keys of a float layer plus the scales); its lookups are ``tokenpos::quantized_embedding``
(:mod:`tokenpos.torch.ops.quantized`), the rows dequantised inside the gather. The formula is
:mod:`tokenpos.tables.formulas.quantize`.

Quantising a trained float table (one spelling in every layer and both backends): load its float ``state_dict``
(``weight`` of a float dtype and no ``weight_scale``) into the 8-bit layer; :func:`quantize_float_state` (a
``load_state_dict`` pre-hook, for a layer inside a model, and :class:`QuantizedTable`'s ``load_state_dict`` for the
layer itself) replaces it by the quantised pair, so ``layer8.load_state_dict(float_layer.state_dict())`` and HF
checkpoints load as they are.

:class:`QuantizedTable` (a base of the three layers) also keeps a float8 table float8 through ``module.to(dtype)``
/ ``.half()``: ``nn.Module`` casts every floating tensor, and torch counts float8 as floating; the layer's cast
changes its scales (and so its output dtype), never its 8-bit values.
``refuse`` (:func:`tokenpos.tables.checks.quantized.quantized_refusal`): the error of what an 8-bit table cannot do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.quantized import quantized_refusal as refuse
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.quantize import quantize_rows
from tokenpos.torch.ops.quantized import quantized_rows

WEIGHT_DTYPES = (torch.int8, torch.float8_e4m3fn)
_FORMATS = {torch.int8: "int8", torch.float8_e4m3fn: "float8_e4m3fn"}


def check_weight_dtype(weight_dtype: Any) -> torch.dtype | None:
    """None, ``torch.int8`` or ``torch.float8_e4m3fn`` (also by name: "int8", "float8_e4m3fn"), else ConfigError."""
    if isinstance(weight_dtype, str):
        weight_dtype = getattr(torch, weight_dtype, weight_dtype)
    if weight_dtype is None or weight_dtype in WEIGHT_DTYPES:
        return weight_dtype  # type: ignore[no-any-return]
    raise ConfigError(f"weight_dtype must be None (the table is dtype), torch.int8 or torch.float8_e4m3fn; "
                      f"got {weight_dtype!r}")


def quantized_parameters(module: Any, shape: tuple[int, int], weight_dtype: torch.dtype, dtype: torch.dtype,
                         device: Any) -> None:
    """Give ``module`` its frozen ``weight`` (shape, weight_dtype) and ``weight_scale`` (rows,) of ``dtype``, zeros,
    and the pre-hook that quantises a float ``weight`` loaded into it."""
    module.weight = nn.Parameter(torch.zeros(shape, dtype=torch.int8, device=device).view(weight_dtype),
                                 requires_grad=False)                        # (float8: the zero bits viewed)
    module.weight_scale = nn.Parameter(torch.zeros(shape[0], dtype=dtype, device=device), requires_grad=False)
    module.register_load_state_dict_pre_hook(quantize_float_state)


def quantize_table(w: Any, weight_dtype: torch.dtype, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A (V, C) float table (tensor or array) -> (q (V, C) of ``weight_dtype``, scale (V,) of ``scale_dtype``), on
    the CPU, by :func:`tokenpos.tables.formulas.quantize.quantize_rows` (bfloat16 scales as that formula rounds
    them)."""
    arr = w.detach().to("cpu", torch.float64).numpy() if isinstance(w, torch.Tensor) else np.asarray(w, np.float64)
    q, s = quantize_rows(arr, str(scale_dtype).removeprefix("torch."), _FORMATS[weight_dtype])
    qt = torch.from_numpy(q)
    return qt.view(weight_dtype), torch.from_numpy(s).to(scale_dtype)


def fill_quantized_(module: Any, w: Any) -> None:
    """Quantise the float table ``w`` (V, C) into ``module.weight`` / ``module.weight_scale`` in place."""
    weight, scale = module.weight, module.weight_scale
    if scale.is_meta:
        return
    q, s = quantize_table(w, weight.dtype, scale.dtype)
    with torch.no_grad():
        weight.copy_(q)
        scale.copy_(s)


def quantize_float_state(module: Any, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook of an 8-bit layer: a float ``weight`` without ``weight_scale`` is quantised
    (into the layer's weight dtype and scale dtype) before it is loaded; anything else is left to the load."""
    key = prefix + "weight"
    w = state_dict.get(key)
    if (not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or w.dtype in WEIGHT_DTYPES
            or prefix + "weight_scale" in state_dict or w.shape != module.weight.shape):
        return
    q, s = quantize_table(w, module.weight.dtype, module.weight_scale.dtype)
    state_dict[key] = q
    state_dict[prefix + "weight_scale"] = s


def _bits(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as the op takes it: int8, or float8's bit patterns as uint8; the scales)."""
    w = module.weight
    return (w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w), module.weight_scale


def quantized_lookup(module: Any, ids: torch.Tensor, multiplier: float) -> torch.Tensor:
    """ids (...) int32 / int64 -> (..., C): the module's 8-bit rows dequantised inside the gather."""
    q, scale = _bits(module)
    return quantized_rows(q, scale, ids, multiplier, module.weight_dtype == torch.float8_e4m3fn)


class QuantizedTable(nn.Module):
    """The 8-bit part of a table layer: a float ``state_dict`` loaded into it is quantised, and a cast never
    reaches a float8 table. Layers set ``weight_dtype`` (None: a float table, and this does nothing)."""

    weight_dtype: torch.dtype | None
    weight: nn.Parameter
    weight_scale: nn.Parameter

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        if getattr(self, "weight_dtype", None) is not None and isinstance(state_dict, dict):
            state_dict = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                          for k, v in state_dict.items()}
            quantize_float_state(self, state_dict, "")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        if getattr(self, "weight_dtype", None) != torch.float8_e4m3fn:
            return super()._apply(fn, recurse)

        def keep_float8(t: torch.Tensor) -> Any:                 # moved as its bits: a cast leaves them alone
            return fn(t.view(torch.uint8)).view(t.dtype) if t.dtype == torch.float8_e4m3fn else fn(t)

        return super()._apply(keep_float8, recurse)


ATTEND_ROWS = 8192
"""``attend`` on an 8-bit table: rows of the table dequantised per block (a (ATTEND_ROWS, D) temporary)."""


def quantized_attend(module: Any, h: torch.Tensor) -> torch.Tensor:
    """Tied logits against an 8-bit table: h (..., D) -> (..., V) = h @ Wd.T, Wd the dequantised table
    (``dequantize_rows`` of every row, multiplier 1), computed a block of :data:`ATTEND_ROWS` rows at a time so no
    float (V, D) copy exists; h is cast to the scales' dtype (the table's float dtype)."""
    q, scale = _bits(module)
    fp8 = module.weight_dtype == torch.float8_e4m3fn
    V = q.shape[0]
    x = h.to(scale.dtype)
    out = x.new_empty((*h.shape[:-1], V))
    for start in range(0, V, ATTEND_ROWS):
        rows = torch.arange(start, min(start + ATTEND_ROWS, V), device=q.device)
        block = quantized_rows(q, scale, rows, 1.0, fp8)                                # (c, D)
        out[..., start:start + block.shape[0]] = torch.nn.functional.linear(x, block)  # (..., c)
    return out


__all__ = ["QuantizedTable", "check_weight_dtype", "fill_quantized_", "quantize_float_state", "quantize_table",
           "quantized_attend", "quantized_lookup", "quantized_parameters", "refuse"]
