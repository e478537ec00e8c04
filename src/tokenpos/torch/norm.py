"""Post-embedding normalisation: LayerNorm (BERT) and RMSNorm, as ``nn.Module``s.

Shapes: x (..., D) -> (..., D); statistics over the last axis. ``F.layer_norm`` / ``F.rms_norm``
compute the statistics in at least float32 for reduced-precision inputs.

state_dict: LayerNorm ``weight`` (D,), ``bias`` (D,); RMSNorm ``weight`` (D,).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.validation import check_choice, check_feature_dim, check_float, check_positive_int
from tokenpos.torch._checks import check_float_tensor, resolve_dtype
from tokenpos.torch._module import TokenposModule

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(TokenposModule):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance)."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.eps = check_float("eps", eps, low=0.0, low_inclusive=False)
        factory = {"device": device, "dtype": resolve_dtype(dtype)}
        self.weight = nn.Parameter(torch.empty(self.d_model, **factory))
        self.bias = nn.Parameter(torch.empty(self.d_model, **factory))
        self.reset_parameters()

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """weight = 1, bias = 0 (seed / rng accepted like every layer's; nothing is random)."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor("x", x)
        check_feature_dim("x", tuple(x.shape), self.d_model)
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class RMSNorm(TokenposModule):
    """``y = x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Zhang & Sennrich 2019)."""

    def __init__(self, d_model: int, *, eps: float = 1e-6, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.eps = check_float("eps", eps, low=0.0, low_inclusive=False)
        self.weight = nn.Parameter(torch.empty(self.d_model, device=device, dtype=resolve_dtype(dtype)))
        self.reset_parameters()

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """weight = 1 (seed / rng accepted like every layer's; nothing is random)."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor("x", x)
        check_feature_dim("x", tuple(x.shape), self.d_model)
        return F.rms_norm(x, (self.d_model,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def build_norm(kind: str | None, d_model: int, eps: float, device: Any = None,
               dtype: Any = None) -> nn.Module | None:
    """None, "layernorm" or "rmsnorm" -> the module (or None)."""
    if kind is None:
        return None
    check_choice("norm", kind, NORMS)
    cls = LayerNorm if kind == "layernorm" else RMSNorm
    return cls(d_model, eps=eps, device=device, dtype=dtype)
