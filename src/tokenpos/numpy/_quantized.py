"""8-bit tables in the NumPy layers: the ``weight_dtype`` setting, the stored parameters, the lookup and loading a
float ``state_dict`` into an 8-bit layer (the torch twin: :mod:`tokenpos.torch._quantized`).

A layer built with ``weight_dtype=np.int8`` (or "int8") holds ``weight`` (V, C) int8 and ``weight_scale`` (V,) of
the layer's ``dtype``, both frozen (``requires_grad=False``); a lookup dequantises the gathered rows only
(:func:`quantized_lookup`: the fused kernel :mod:`tokenpos.kernels.quantized` with kernels on, else the formula
:func:`tokenpos.tables.formulas.quantize.dequantize_rows`; the same bits). NumPy has no float8 dtype, so
float8 e4m3fn tables are torch's only (refused here with a ConfigError saying so).

Quantising a trained float table: load its float ``state_dict`` (``weight`` of a float dtype, no
``weight_scale``) into the 8-bit layer (:class:`QuantizedTable`'s ``load_state_dict`` quantises it first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos._config import OUTPUTS, kernels_enabled
from tokenpos.kernels.quantized import gather_dequantized
from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.quantized import quantized_refusal as refuse
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.quantize import dequantize_rows, quantize_rows


def check_weight_dtype(weight_dtype: Any) -> str | None:
    """None or int8 (``np.int8`` or "int8") -> None or "int8"; anything else a ConfigError (float8: torch only)."""
    if weight_dtype is None:
        return None
    name = weight_dtype if isinstance(weight_dtype, str) else getattr(weight_dtype, "__name__", None)
    if name is None:
        try:
            name = np.dtype(weight_dtype).name
        except TypeError:
            name = repr(weight_dtype)
    if name == "int8":
        return "int8"
    if "float8" in str(name) or "float8" in str(weight_dtype):
        raise ConfigError(f"weight_dtype must be None or int8 in NumPy (no float8 dtype there; float8_e4m3fn "
                          f"tables are the torch backend's); got {weight_dtype!r}")
    raise ConfigError(f"weight_dtype must be None (the table is dtype) or int8; got {weight_dtype!r}")


def quantized_parameters(module: Any, shape: tuple[int, int], dtype: np.dtype) -> None:
    """Give ``module`` its frozen ``weight`` (shape) int8 and ``weight_scale`` (rows,) of ``dtype``, zeros."""
    module.weight = Parameter(np.zeros(shape, np.int8), requires_grad=False)
    module.weight_scale = Parameter(np.zeros(shape[0], dtype), requires_grad=False)


def fill_quantized(module: Any, w: np.ndarray) -> None:
    """Quantise the float table ``w`` (V, C) into ``module.weight`` / ``module.weight_scale`` in place."""
    module.weight.data[...], module.weight_scale.data[...] = quantize_rows(w, module.weight_scale.data.dtype)
    module.weight.zero_grad()


def quantized_lookup(q: np.ndarray, scale: np.ndarray, ids: np.ndarray, multiplier: float) -> np.ndarray:
    """Checked ids (...) -> (..., C) of scale's dtype: the dequantised rows (kernel or formula: the same bits)."""
    if not kernels_enabled():
        return dequantize_rows(q, scale, ids, multiplier)
    shape = (*ids.shape, q.shape[1])
    out = OUTPUTS.empty(shape, scale.dtype)                    # (np.empty under the cache's min_bytes)
    half = scale.dtype == np.float16                                          # fp16 travels as int16 bits
    gather_dequantized(q, scale.view(np.int16) if half else scale, ids, multiplier, out.view(np.int16) if half else out)
    return out


ATTEND_ROWS = 8192
"""``attend`` on an 8-bit table: rows of the table dequantised per block (a (ATTEND_ROWS, D) temporary)."""


def quantized_attend(q: np.ndarray, scale: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Tied logits against an 8-bit table: h (..., D) -> (..., V) = h @ Wd.T in scale's dtype, Wd the dequantised
    table (:func:`dequantize_rows` of every row, multiplier 1), a block of :data:`ATTEND_ROWS` rows at a time (no
    float (V, D) copy)."""
    V = q.shape[0]
    x = h.astype(scale.dtype, copy=False)
    out = np.empty((*h.shape[:-1], V), scale.dtype)
    for start in range(0, V, ATTEND_ROWS):
        rows = np.arange(start, min(start + ATTEND_ROWS, V))
        out[..., start:start + rows.shape[0]] = x @ quantized_lookup(q, scale, rows, 1.0).T      # (..., c)
    return out


class QuantizedTable(Module):
    """The 8-bit part of a NumPy table layer: a float ``state_dict`` (``weight`` of a float dtype and no
    ``weight_scale``) loaded into an 8-bit layer is quantised first. Layers set ``weight_dtype``."""

    weight_dtype: str | None
    weight: Parameter
    weight_scale: Parameter

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        if getattr(self, "weight_dtype", None) is not None and isinstance(state, dict) and "weight_scale" not in state:
            w: Any = state.get("weight")
            if hasattr(w, "detach"):
                w = w.detach().cpu().float().numpy() if str(w.dtype) == "torch.bfloat16" else w.detach().cpu().numpy()
            if isinstance(w, np.ndarray) and w.dtype.kind == "f" and w.shape == self.weight.data.shape:
                q, s = quantize_rows(w, self.weight_scale.data.dtype)
                state = {**state, "weight": q, "weight_scale": s}
        super().load_state_dict(state, strict=strict)


__all__ = ["QuantizedTable", "check_weight_dtype", "fill_quantized", "quantized_attend", "quantized_lookup",
           "quantized_parameters", "refuse"]
