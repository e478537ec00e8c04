"""FIRE for the torch backend: a learned MLP of the log-normalised relative distance, added to logits.

Shapes: H heads, W MLP width, Lq query length, Lk key length (query i sits at key position
``Lk - Lq + i`` by default). Formula, and where it follows the paper's reference listing rather
than its text: ``tokenpos.tables.formulas.fire``. Autograd gives the backward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_float, check_positive_int
from tokenpos.tables.formulas.fire import FIRE_EPS, FIRE_INIT_C, fire_init, fire_param_shapes
from tokenpos.tables.formulas.t5 import resolve_query_offset
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._init import resolve_torch_rng
from tokenpos.torch._module import TokenposModule


class FIRE(TokenposModule):
    """FIRE attention bias (Li et al., ICLR 2024), the paper's reference listing.

    Args:
        num_heads: H.
        width: W, the MLP's hidden width (32 in the paper).
        init_L: the fixed part of the learned threshold (``|L_multiplier * init_L|``); use the
            training length.
        init_c: initial c (0.1). eps: added to the normaliser (1e-6).
        seed / rng: the NumPy backend's numbers (``tables.formulas.fire.fire_init``); else seeded from torch's
            ``generator``. device, dtype: factory kwargs (the bias is computed in ``dtype``, float32 at least).

    state_dict: ``in_weight`` (W,), ``in_bias`` (W,), ``out_weight`` (W, H), ``out_bias`` (H,), ``c`` (1,),
    ``L_multiplier`` (1,).

    Shape:
        bias(q_len, k_len) -> (H, Lq, Lk).
    """

    kind = "bias"
    name = "fire"
    in_weight: nn.Parameter      # (W,)   registered by name from tables.formulas.fire.fire_param_shapes
    in_bias: nn.Parameter        # (W,)
    out_weight: nn.Parameter     # (W, H)
    out_bias: nn.Parameter       # (H,)
    c: nn.Parameter              # (1,)
    L_multiplier: nn.Parameter   # (1,)

    def __init__(self, num_heads: int, *, width: int = 32, init_L: float = 512.0, init_c: float = FIRE_INIT_C,
                 eps: float = FIRE_EPS, device: Any = None, dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.width = check_positive_int("width", width)
        self.init_L = check_float("init_L", init_L, low=0.0, low_inclusive=False)
        self.init_c = check_float("init_c", init_c)
        self.eps = check_float("eps", eps, low=0.0)
        dtype = resolve_dtype(dtype)
        for key, shape in fire_param_shapes(self.num_heads, self.width).items():
            self.register_parameter(key, nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw every parameter (seed/rng: the NumPy numbers; else seeded from torch's generator)."""
        values = fire_init(self.num_heads, self.width, resolve_torch_rng(seed, rng, generator), init_c=self.init_c)
        for key, value in values.items():
            param = getattr(self, key)
            if not param.is_meta:
                param.copy_(torch.from_numpy(value))

    def bias(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> torch.Tensor:
        """The bias (H, Lq, Lk); ``query_offset`` (default Lk - Lq) is the key position of query 0."""
        offset = resolve_query_offset(q_len, k_len, query_offset)
        w = self.out_weight
        calc = torch.promote_types(w.dtype, torch.float32)
        q_pos = torch.arange(q_len, device=w.device, dtype=calc) + offset                  # (Lq,)
        rel = q_pos[:, None] - torch.arange(k_len, device=w.device, dtype=calc)[None, :]     # (Lq, Lk)
        c = self.c.to(calc)
        threshold = (self.L_multiplier.to(calc) * self.init_L).abs()                         # (1,)
        norm = torch.maximum(q_pos, threshold)                                              # (Lq,)
        u = torch.log((c * rel).abs() + 1.0)                                                # (Lq, Lk)
        v = torch.log((c * norm).abs() + 1.0) + self.eps                                    # (Lq,)
        x = u / v[:, None]                                                                  # (Lq, Lk)
        h = torch.relu(x[..., None] * self.in_weight.to(calc) + self.in_bias.to(calc))     # (Lq, Lk, W)
        out = h @ w.to(calc) + self.out_bias.to(calc)                                       # (Lq, Lk, H)
        return out.permute(2, 0, 1).to(w.dtype)                                             # (H, Lq, Lk)

    forward = bias

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, width={self.width}, init_L={self.init_L}"
