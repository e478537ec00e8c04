"""KERPLE (log variant) for the torch backend: ``-r1 * log(1 + r2 * |i - j|)`` per head, added to logits.

Shapes: H heads, Lq query length, Lk key length (query i sits at key position ``Lk - Lq + i`` by
default). Formula, initialisation and the in-place positivity projection of the reference code:
``tokenpos.tables.formulas.kerple``. Autograd gives the backward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.bias import check_kerple_eps
from tokenpos.tables.checks.validation import check_positive_int
from tokenpos.tables.formulas.kerple import KERPLE_EPS, kerple_init
from tokenpos.tables.formulas.t5 import resolve_query_offset
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._init import resolve_torch_rng
from tokenpos.torch._module import TokenposModule


class KERPLE(TokenposModule):
    """KERPLE-log attention bias (Chi et al., NeurIPS 2022), as the reference code computes it.

    Every call to :meth:`bias` first clamps ``r1`` and ``r2`` in place to at least ``eps`` (the
    reference code's projection), then computes ``-r1 * log1p(r2 * d)`` in float32 at least.

    Args:
        num_heads: H. eps: the clamp floor (1e-2).
        seed / rng: the NumPy backend's numbers; else seeded from torch's ``generator``.
        device, dtype: factory kwargs.

    state_dict: ``r1`` (H,) (the code's ``bias_p``), ``r2`` (H,) (``bias_a``).

    Shape:
        bias(q_len, k_len) -> (H, Lq, Lk).
    """

    kind = "bias"
    name = "kerple"

    def __init__(self, num_heads: int, *, eps: float = KERPLE_EPS, device: Any = None, dtype: Any = None,
                 seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.eps = check_kerple_eps(eps)
        dtype = resolve_dtype(dtype)
        self.r1 = nn.Parameter(torch.empty(self.num_heads, device=device, dtype=dtype))
        self.r2 = nn.Parameter(torch.empty(self.num_heads, device=device, dtype=dtype))
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw r1 = 2 U(0, 1) and r2 = U(0, 1) (seed/rng: the NumPy numbers)."""
        r1, r2 = kerple_init(self.num_heads, resolve_torch_rng(seed, rng, generator))
        if not self.r1.is_meta:
            self.r1.copy_(torch.from_numpy(r1))
            self.r2.copy_(torch.from_numpy(r2))

    def bias(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> torch.Tensor:
        """The bias (H, Lq, Lk) after projecting r1, r2 to >= eps in place."""
        offset = resolve_query_offset(q_len, k_len, query_offset)
        with torch.no_grad():
            self.r1.clamp_(min=self.eps)
            self.r2.clamp_(min=self.eps)
        calc = torch.promote_types(self.r1.dtype, torch.float32)
        dev = self.r1.device
        q_pos = torch.arange(q_len, device=dev, dtype=calc) + offset
        dist = (q_pos[:, None] - torch.arange(k_len, device=dev, dtype=calc)[None, :]).abs()   # (Lq, Lk)
        r1, r2 = self.r1.to(calc)[:, None, None], self.r2.to(calc)[:, None, None]
        return (-r1 * torch.log1p(r2 * dist)).to(self.r1.dtype)                                # (H, Lq, Lk)

    forward = bias

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, eps={self.eps}"
