"""SinusoidalPositionalEncoding: the fixed Vaswani table, not trainable, defined for every position.

Shapes: P = max_seq_len (the precomputed rows), D = d_model, F = ceil(D / 2), positions (...) -> (..., D).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenpos.tables.checks.validation import check_choice, check_float, check_positive_int
from tokenpos.tables.formulas.sinusoidal import LAYOUTS, sinusoidal_inv_freq, sinusoidal_table
from tokenpos.torch._checks import (
    as_index,
    check_position_tensor,
    check_seq_len,
    is_seq_len,
    resolve_dtype,
    values_readable,
)
from tokenpos.torch._checks import calc_dtype as _calc_dtype
from tokenpos.torch._module import TokenposModule


class SinusoidalPositionalEncoding(TokenposModule):
    """``PE[pos, 2i] = sin(pos / base**(2i/D))``, ``PE[pos, 2i+1] = cos(...)`` (or the "half" layout).

    The first ``max_seq_len`` rows are computed in float64 by ``tokenpos.tables`` and cast once into a
    non-persistent buffer ``table`` (P, D); positions beyond it are computed on demand in float64
    (float32 on MPS) and cast, never refused. Whatever the dtype, a bf16 module gives the float64
    values rounded once to bf16. No parameters; empty state_dict.

    Under ``torch.compile``, position tensors always take the formula path (no data-dependent branch).

    Shape:
        forward(L: int) -> (L, D); forward(positions (...)) -> (..., D).
    """

    kind = "additive"
    name = "sinusoidal"
    extends = True           # positions beyond the table are computed (:meth:`encode`)
    padding_idx = None       # no padding row
    table: torch.Tensor
    inv_freq: torch.Tensor

    def __init__(self, max_seq_len: int, d_model: int, *, base: float = 10000.0, layout: str = "interleaved",
                 device: Any = None, dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        # seed/rng/generator are accepted so every layer has the same constructor; the table is deterministic.
        super().__init__()
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.base = check_float("base", base, low=1.0, low_inclusive=False)
        self.layout = check_choice("layout", layout, LAYOUTS)
        dtype = resolve_dtype(dtype)
        self.register_buffer("table", torch.empty(self.max_seq_len, self.d_model, device=device, dtype=dtype),
                             persistent=False)                                      # (P, D)
        calc = _calc_dtype(self.table.device)
        self.register_buffer("inv_freq", torch.empty((self.d_model + 1) // 2, device=device, dtype=calc),
                             persistent=False)                                      # (F,)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """(Re)compute the buffers from ``tokenpos.tables`` (e.g. after materialising from meta).

        seed / rng are accepted (every scheme takes them) and unused: the table is deterministic.
        """
        if self.table.is_meta:
            return
        table = sinusoidal_table(self.max_seq_len, self.d_model, base=self.base, layout=self.layout)
        self.table.copy_(torch.from_numpy(table))
        self.inv_freq.copy_(torch.from_numpy(sinusoidal_inv_freq(self.d_model, base=self.base)))

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to(dtype) / .half() must not cast the float64 frequencies, and the table is recomputed from
        # float64 rather than cast from the old dtype (so bf16 after fp32 is a single rounding).
        inv_freq = self.inv_freq
        out = super()._apply(fn, recurse)
        calc = _calc_dtype(self.inv_freq.device)
        if self.inv_freq.dtype != calc or inv_freq.dtype != calc:
            self.inv_freq = inv_freq.to(device=self.inv_freq.device, dtype=calc)
        if not self.table.is_meta:
            self.reset_parameters()
        return out

    def encode(self, positions: torch.Tensor) -> torch.Tensor:
        """The formula, in float64 (float32 on MPS), cast at the end: positions (...) -> (..., D)."""
        angles = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq        # (..., F)
        n_cos = self.d_model - self.inv_freq.shape[0]                                 # floor(D/2)
        sin, cos = torch.sin(angles), torch.cos(angles[..., :n_cos])
        if self.layout == "half":
            out = torch.cat([sin, cos], dim=-1)
        else:
            if n_cos < sin.shape[-1]:                                                 # odd D
                cos = torch.cat([cos, torch.zeros_like(sin[..., :1])], dim=-1)
            out = torch.stack([sin, cos], dim=-1).flatten(-2)[..., : self.d_model]    # (..., D)
        return out.to(self.table.dtype)

    def forward(self, seq_len_or_positions: Any) -> torch.Tensor:
        """Rows of the table (a new tensor, never a view of it); positions >= max_seq_len are computed."""
        if is_seq_len(seq_len_or_positions):
            L = check_seq_len(seq_len_or_positions, None)
            if L <= self.max_seq_len:
                return self.table[:L].clone()                                        # (L, D)
            return self.encode(torch.arange(L, device=self.table.device))
        pos = check_position_tensor(seq_len_or_positions, device=self.table.device)
        # the table's rows when every position is inside it; read on the CPU only (elsewhere a read
        # would sync): the formula then, the same bits as the table
        if not pos.is_cpu or not values_readable(pos) or (pos.numel() and int(pos.max()) >= self.max_seq_len):
            return self.encode(pos)
        return self.table[as_index(pos)]                                             # (..., D), a copy

    def extra_repr(self) -> str:
        return f"{self.max_seq_len}, {self.d_model}, base={self.base}, layout={self.layout!r}"
