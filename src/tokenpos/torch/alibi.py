"""ALiBi for the torch backend: a fixed linear distance bias added to attention logits.

Shapes: H heads, Lq query length, Lk key length (Lq <= Lk; query i sits at key position Lk - Lq + i).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenpos.tables.checks.bias import bias_length_message
from tokenpos.tables.checks.validation import check_int, check_positive_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.alibi import alibi_slopes
from tokenpos.torch._checks import calc_dtype as _calc_dtype
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._module import TokenposModule


class ALiBi(TokenposModule):
    """Attention with Linear Biases: ``bias[h, i, j] = -slope_h * |q_pos(i) - j|``.

    The slopes come from ``tokenpos.tables.alibi_slopes`` (float64) and live in the non-persistent
    buffer ``slopes`` (H,), kept in float64 (float32 on MPS) whatever ``.to(dtype)`` says. No
    parameters, empty state_dict. Causal masking is the attention's job.

    Args:
        num_heads: H (non-powers of two follow the paper / HF Bloom).
        device: factory kwarg. dtype: the dtype of the returned bias (None = torch's default).
        seed, rng: accepted as by every scheme; unused (the slopes are deterministic).

    Shape:
        bias(q_len, k_len) -> (H, Lq, Lk).
    """

    kind = "bias"
    name = "alibi"

    def __init__(self, num_heads: int, *, device: Any = None, dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.dtype = resolve_dtype(dtype)
        dev = torch.empty(0, device=device).device
        self.slopes: torch.Tensor
        self.register_buffer("slopes", torch.empty(self.num_heads, device=dev, dtype=_calc_dtype(dev)),
                             persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """(Re)fill the slopes from ``tokenpos.tables`` (seed / rng unused: nothing is random)."""
        if not self.slopes.is_meta:
            self.slopes = torch.from_numpy(alibi_slopes(self.num_heads)).to(self.slopes.device,
                                                                             _calc_dtype(self.slopes.device))

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)        # .half() must not round the slopes: refill them
        if not self.slopes.is_meta and self.slopes.dtype != _calc_dtype(self.slopes.device):
            self.reset_parameters()
        return out

    def bias(self, q_len: int, k_len: int) -> torch.Tensor:
        """The (H, Lq, Lk) bias in ``dtype``; ConfigError when q_len > k_len."""
        q_len, k_len = check_int("q_len", q_len, minimum=0), check_int("k_len", k_len, minimum=0)
        if q_len > k_len:
            raise ConfigError(bias_length_message(q_len, k_len))
        dev, calc = self.slopes.device, self.slopes.dtype
        q_pos = torch.arange(k_len - q_len, k_len, device=dev, dtype=calc)[:, None]
        dist = (q_pos - torch.arange(k_len, device=dev, dtype=calc)[None, :]).abs()       # (Lq, Lk)
        return (-self.slopes[:, None, None] * dist).to(self.dtype)                         # (H, Lq, Lk)

    forward = bias

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
