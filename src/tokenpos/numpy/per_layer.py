"""PerLayerEmbedding: one (V, L * P) table looked up by token ids and read as L rows of P (Gemma 3n, Gemma 4).

Gemma 3n and the small Gemma 4 models feed every decoder layer a vector of its own per token: one
table of shape (V, L * P) (HF's ``embed_tokens_per_layer.weight``, loaded here as ``weight`` unchanged),
gathered by the token ids, scaled by sqrt(P) as HF rounds it (:mod:`tokenpos.tables.formulas.per_layer`)
and reshaped to (..., L, P). The gather is the token embedding's own (``functional.embedding_forward``);
its backward is the token embedding's row-sparse one, so the lazy optimisers touch only the rows used.
``weight_dtype=np.int8`` stores the table quantised (int8 rows, one scale per row, frozen) and dequantises
the gathered rows only (``tables.formulas.quantize.dequantize_rows``).

Shapes: V vocab, L num_layers, P dim (the per-layer width), ids of any shape (...), out (..., L, P).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized,
    quantized_lookup,
    quantized_parameters,
    refuse,
)
from tokenpos.numpy.module import Parameter
from tokenpos.tables.checks.validation import check_dtype, check_grad, check_token_ids
from tokenpos.tables.formulas.init import init_weight, resolve_rng
from tokenpos.tables.formulas.per_layer import per_layer_args, per_layer_multiplier, per_layer_repr, zero_out_of_range


class PerLayerEmbedding(QuantizedTable):
    """Token ids -> one P-vector per layer, (..., L, P), from a single (V, L * P) table.

    Args:
        vocab_size: V > 0 (HF: ``vocab_size_per_layer_input``).
        num_layers: L > 0 (HF: ``num_hidden_layers``).
        dim: P > 0 (HF: ``hidden_size_per_layer_input``).
        scale: multiply the rows by ``multiplier``, sqrt(P) rounded as HF rounds it (float32, then the table's
            dtype; :func:`tokenpos.tables.formulas.per_layer.per_layer_multiplier`).
        padding_idx: that row starts at zero and never receives gradient from lookups (HF: ``pad_token_id``).
        out_of_range: "raise" (an id outside [0, V) raises ``TokenIdError``) or "zero" (an id >= V reads
            row 0, as HF Gemma 3n maps multimodal ids; negative ids still raise).
        init, std: the init scheme of the table ("normal", "trunc_normal", "xavier_uniform", "standard_normal",
            "zeros") and the std of the normal ones.
        dtype: float16, float32 (default) or float64: the table's (and the output's) dtype.
        weight_dtype: None (the table is ``dtype``) or ``np.int8``: the table is stored quantised, ``weight`` int8
            (V, L * P) and ``weight_scale`` (V,) of ``dtype``, one scale per row, both frozen; the gathered rows
            are dequantised (``tables.formulas.quantize.dequantize_rows``: q * scale * multiplier in float32,
            rounded once to ``dtype``). Initial weights are drawn, then quantised (``quantize_rows``); load other
            values with ``load_state_dict``. Inference only: ``backward`` refuses.
        seed / rng: the explicit source of the initial weights.

    Shape:
        forward: ids (...) int -> (..., L, P). backward: grad (..., L, P) -> None (row-sparse weight gradient).

    state_dict: ``weight`` (V, L * P) (int8 tables: and ``weight_scale`` (V,)).
    """

    def __init__(self, vocab_size: int, num_layers: int, dim: int, *, scale: bool = True,
                 padding_idx: int | None = None, out_of_range: str = "raise", init: str = "normal",
                 std: float = 0.02, dtype: Any = np.float32, weight_dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        (self.vocab_size, self.num_layers, self.dim, self.scale, self.padding_idx, self.out_of_range,
         self.init) = per_layer_args(vocab_size, num_layers, dim, scale, padding_idx, out_of_range, init)
        self.std = std
        self.dtype = check_dtype("dtype", dtype)
        self.weight_dtype = check_weight_dtype(weight_dtype)
        self.quantized = self.weight_dtype is not None
        shape = (self.vocab_size, self.num_layers * self.dim)
        if self.quantized:
            quantized_parameters(self, shape, self.dtype)
        else:
            self.weight = Parameter(np.empty(shape, self.dtype))
        self.reset_parameters(rng=resolve_rng(seed, rng))
        self._cache: F.EmbeddingCache | None = None

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by: sqrt(P) rounded as HF rounds it for the table's dtype when
        ``scale`` is set, else 1.0."""
        dtype = self.weight_scale.data.dtype if self.quantized else self.weight.data.dtype
        return per_layer_multiplier(self.dim, dtype.name) if self.scale else 1.0

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an int8 table: then quantised); the padding row is zeroed."""
        w = init_weight(self.weight.data.shape, self.init, std=self.std, rng=resolve_rng(seed, rng),
                        padding_idx=self.padding_idx)
        if self.quantized:
            fill_quantized(self, w)
        else:
            self.weight.data[...] = w
        self.weight.zero_grad()

    def forward(self, ids: Any) -> np.ndarray:
        """ids (...) -> (..., L, P) = (W[ids] * multiplier) viewed as L rows of P. Bad ids raise TokenIdError
        naming the value and the range (ids >= V read row 0 with ``out_of_range="zero"``), before anything is
        kept."""
        if self.out_of_range == "zero":
            ids = zero_out_of_range(ids, self.vocab_size)
        ids = check_token_ids(ids, self.vocab_size)
        if self.quantized:                                      # the gathered rows dequantised; nothing kept
            out = quantized_lookup(self.weight.data, self.weight_scale.data, ids, self.multiplier)  # (..., L * P)
            self._cache = None
            return out.reshape(*ids.shape, self.num_layers, self.dim)
        out, cache = F.embedding_forward(self.weight.data, ids, scale=self.multiplier,
                                         padding_idx=self.padding_idx)             # (..., L * P)
        self._cache = cache
        return out.reshape(*ids.shape, self.num_layers, self.dim)                  # (..., L, P)

    def backward(self, grad_output: np.ndarray) -> None:
        """Accumulate the row-sparse gradient of the last forward: grad (..., L, P); returns None (ids are not
        float). Rows read for ids >= V (``out_of_range="zero"``) send their gradient to row 0, as in HF."""
        if self.quantized:
            raise refuse(self, "backward")
        cache = self._cached(self._cache)
        grad = check_grad("grad_output", grad_output, cache.ids.shape + (self.num_layers, self.dim))
        if self.weight.requires_grad:
            flat = grad.reshape(*cache.ids.shape, self.num_layers * self.dim)       # (..., L * P)
            (ids, rows), _ = F.embedding_backward(flat, cache)
            self.weight.accumulate_rows(ids, rows, coalesced=True)

    def extra_repr(self) -> str:
        s = per_layer_repr(self.vocab_size, self.num_layers, self.dim, self.padding_idx, self.scale, self.out_of_range)
        if self.quantized:
            s += ", weight_dtype=int8"
        return s + f", dtype={self.dtype}"
