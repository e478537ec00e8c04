"""TokenEmbedding: the (V, D) lookup table, its row-sparse backward, the tied output projection.

Shapes: V vocab, D d_model, ids of any shape (...), h (..., D), logits (..., V).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized,
    quantized_attend,
    quantized_lookup,
    quantized_parameters,
    refuse,
)
from tokenpos.numpy.module import Parameter
from tokenpos.tables.checks.tied_loss import check_same_dtype
from tokenpos.tables.checks.token_table import check_resize, check_table_shape
from tokenpos.tables.checks.validation import (
    check_bool,
    check_dtype,
    check_feature_dim,
    check_float_array,
    check_grad,
    check_padding_idx,
    check_positive_int,
    check_token_ids,
)
from tokenpos.tables.formulas.init import RESIZE_INITS, init_weight, resolve_rng

INT64 = np.dtype(np.int64)
"""The ids' dtype whose check the layers make inline, as one reduction: an int64 array viewed as uint64 holds
every id in [0, V) exactly when its maximum is below V (a negative id is 2**63 or more there); the same
verdict as ``check_token_ids``, which then names the first bad id. Other dtypes, and lists, take that check."""


class TokenEmbedding(QuantizedTable):
    """Token ids -> vectors, optionally scaled by sqrt(d_model).

    Args:
        vocab_size: V > 0.
        d_model: D > 0.
        init: "normal" (N(0, std)), "trunc_normal" (+-2 std), "xavier_uniform", "standard_normal", "zeros".
        std: the std of the normal schemes.
        scale: a bool switch: multiply the output by ``multiplier`` = sqrt(D) (Vaswani et al.).
        padding_idx: that row starts at zero and never receives gradient from lookups.
        dtype: float16, float32 (default) or float64.
        weight_dtype: None (the table is ``dtype``) or ``np.int8`` / "int8": the table is stored in 8 bits,
            ``weight`` (V, D) int8 and ``weight_scale`` (V,) of ``dtype``, both frozen; a lookup dequantises the
            gathered rows only (``tables.formulas.quantize.dequantize_rows``; the fused kernel with kernels on).
            A float ``state_dict`` loaded into the layer (or ``from_pretrained(..., weight_dtype=)``) is quantised.
            Inference only: ``attend`` works (logits against the dequantised table, a block of rows at a time);
            ``backward``, ``attend_backward``, ``loss`` and ``resize`` raise ConfigError. (float8: torch only.)
        seed / rng: the explicit source of the initial weights.

    Shape:
        forward: ids (...) int -> (..., D). attend: h (..., D) -> logits (..., V).
    """

    def __init__(self, vocab_size: int, d_model: int, *, init: str = "normal", std: float = 0.02,
                 scale: bool = False, padding_idx: int | None = None, dtype: Any = np.float32,
                 weight_dtype: Any = None, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        self.padding_idx = check_padding_idx(padding_idx, self.vocab_size)
        self.scale = check_bool("scale", scale)
        self.init, self.std = init, std
        self.dtype = check_dtype("dtype", dtype)
        self.weight_dtype = check_weight_dtype(weight_dtype)
        if self.weight_dtype is not None:
            quantized_parameters(self, (self.vocab_size, self.d_model), self.dtype)
        else:
            self.weight = Parameter(np.empty((self.vocab_size, self.d_model), self.dtype))
        self.reset_parameters(rng=resolve_rng(seed, rng))
        self._cache: F.EmbeddingCache | None = None
        self._attend_cache: F.AttendCache | None = None
        self._loss_cache: F.TiedLossCache | None = None

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by: sqrt(D) when the switch ``scale`` is True, else 1.0.

        A Python float, never rounded to the table dtype first (float16 tables multiply in float32).
        """
        return math.sqrt(self.d_model) if self.scale else 1.0

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an 8-bit table: then quantised); the padding row is zeroed."""
        w = init_weight(self.weight.data.shape, self.init, std=self.std, rng=resolve_rng(seed, rng),
                        padding_idx=self.padding_idx)
        if self.weight_dtype is not None:
            fill_quantized(self, w)
            return
        self.weight.data[...] = w
        self.weight.zero_grad()

    @classmethod
    def from_pretrained(cls, weights: Any, *, freeze: bool = True, padding_idx: int | None = None,
                        scale: bool = False, weight_dtype: Any = None) -> TokenEmbedding:
        """Wrap an existing (V, D) array (copied). ``freeze=True`` makes it non-trainable. ``weight_dtype``
        (int8): the float table quantised, frozen (``freeze=False`` is refused)."""
        w = np.array(weights.detach().cpu().numpy() if hasattr(weights, "detach") else weights)
        check_table_shape(tuple(w.shape))
        if check_weight_dtype(weight_dtype) is not None:
            if not freeze or w.dtype.kind != "f":
                raise refuse(cls, "freeze=False (training)" if not freeze else f"a {w.dtype} table", "int8")
            layer = cls(w.shape[0], w.shape[1], init="zeros", padding_idx=padding_idx, scale=scale, dtype=w.dtype,
                        weight_dtype=weight_dtype)
            fill_quantized(layer, w)
            return layer
        layer = cls(w.shape[0], w.shape[1], init="zeros", padding_idx=padding_idx, scale=scale, dtype=w.dtype)
        layer.weight.data[...] = w
        layer.weight.requires_grad = not freeze
        return layer

    # -- lookup ------------------------------------------------------------------------------
    def forward(self, ids: Any) -> np.ndarray:
        """ids (...) -> W[ids] * multiplier, (..., D). Bad ids raise TokenIdError naming the value and the range,
        before anything is kept: an int64 array is read by one reduction (:data:`INT64`), anything else and a bad
        id go through the shared check."""
        vocab = self.vocab_size
        if not (type(ids) is np.ndarray and ids.dtype == INT64 and ids.size and ids.view(np.uint64).max() < vocab):
            ids = check_token_ids(ids, vocab)
        if self.weight_dtype is not None:                      # 8 bits: the gathered rows dequantised; nothing kept
            self._cache = None
            return quantized_lookup(self.weight.data, self.weight_scale.data, ids, self.multiplier)   # (..., D)
        out, cache = F.embedding_forward(self.weight.data, ids, scale=self.multiplier if self.scale else 1.0,
                                         padding_idx=self.padding_idx)
        object.__setattr__(self, "_cache", cache)          # a plain attribute (``Module.__setattr__``: one call more)
        return out

    def backward(self, grad_output: np.ndarray) -> None:
        """Accumulate the row-sparse gradient of the last forward; returns None (ids are not float)."""
        if self.weight_dtype is not None:
            raise refuse(self, "backward")
        cache = self._cached(self._cache)
        grad = check_grad("grad_output", grad_output, cache.ids.shape + (self.d_model,))
        if self.weight.requires_grad:
            (ids, rows), _ = F.embedding_backward(grad, cache)
            self.weight.accumulate_rows(ids, rows, coalesced=True)

    # -- tied output projection --------------------------------------------------------------
    def attend(self, h: np.ndarray) -> np.ndarray:
        """Logits against the same table: h (..., D) -> (..., V) = h @ W.T (flax's ``attend``); h of the table's
        dtype (DtypeError otherwise, as ``loss`` and the torch twin)."""
        h = check_float_array("h", h)
        check_feature_dim("h", h.shape, self.d_model)
        if self.weight_dtype is not None:                       # 8 bits: a block of dequantised rows at a time
            self._attend_cache = None
            return quantized_attend(self.weight.data, self.weight_scale.data, h)
        if h.dtype != self.weight.data.dtype:
            check_same_dtype(h.dtype, self.weight.data.dtype)                  # raises
        logits, self._attend_cache = F.attend_forward(h, self.weight.data)
        return logits

    def attend_backward(self, grad_logits: np.ndarray) -> np.ndarray:
        """grad (..., V) -> grad_h (..., D); adds the dense (V, D) weight gradient.

        Like a tied ``nn.Linear``, the projection is dense: every row, the padding row included,
        receives gradient here.
        """
        if self.weight_dtype is not None:
            raise refuse(self, "attend_backward")
        cache = self._cached(self._attend_cache, "attend_backward")
        g = check_grad("grad_logits", grad_logits, cache.h.shape[:-1] + (self.vocab_size,))
        dh, dweight = F.attend_backward(g, cache)
        self.weight.accumulate(dweight)
        return dh

    def loss(self, h: Any, targets: Any, *, ignore_index: int = -100, label_smoothing: float = 0.0,
             reduction: str = "mean", softcap: float | None = None, chunk_size: int | None = None) -> np.ndarray:
        """The tied output layer's cross-entropy without the logits: h (..., D), targets (...) -> loss () or (...).

        ``tokenpos.numpy.tied_cross_entropy(h, self.weight.data, targets, ...)``, keeping its cache for
        ``loss_backward``; in training mode a "mean" / "sum" loss computes its gradients from the same blocks
        of logits (``loss_backward`` then only scales them). Raises as that function does (a bad target:
        TokenIdError).
        """
        if self.weight_dtype is not None:
            raise refuse(self, "loss (the tied loss trains the table)")
        loss, self._loss_cache = F.tied_cross_entropy_forward(
            h, self.weight.data, targets, ignore_index=ignore_index, label_smoothing=label_smoothing,
            reduction=reduction, softcap=softcap, chunk_size=chunk_size, with_grad=self.training)
        return loss

    def loss_backward(self, grad_loss: Any = 1.0) -> np.ndarray:
        """grad of the loss (() or the (...) of reduction "none"; default 1) -> grad_h (..., D); adds the
        dense (V, D) weight gradient (every row receives gradient, as in ``attend_backward``)."""
        cache = self._cached(self._loss_cache, "loss_backward")
        dh, dweight = F.tied_cross_entropy_backward(F.loss_grad("grad_loss", grad_loss, cache), cache)
        self.weight.accumulate(dweight)
        return dh

    # -- resizing ----------------------------------------------------------------------------
    def resize(self, new_vocab_size: int, *, pad_to_multiple_of: int | None = None, init: str = "mean",
               allow_shrink: bool = False, seed: int | None = None,
               rng: np.random.Generator | None = None) -> TokenEmbedding:
        """Grow (or, with ``allow_shrink=True``, cut) the vocabulary in place; returns self.

        New rows are the mean of the old rows (``init="mean"``, as HF does for added tokens) or
        drawn from an init scheme. ``pad_to_multiple_of`` rounds the new size up. Gradients and
        caches are cleared; optimiser state for this table must be rebuilt.
        """
        if self.weight_dtype is not None:
            raise refuse(self, "resize")
        new_v = check_resize(self.vocab_size, new_vocab_size, pad_to_multiple_of=pad_to_multiple_of, init=init,
                             inits=RESIZE_INITS, allow_shrink=allow_shrink, padding_idx=self.padding_idx)
        old = self.weight.data
        keep = min(new_v, self.vocab_size)
        new = np.empty((new_v, self.d_model), dtype=self.dtype)
        new[:keep] = old[:keep]
        if new_v > keep:
            if init == "mean":
                new[keep:] = old.astype(np.float64).mean(axis=0)
            else:
                new[keep:] = init_weight((new_v - keep, self.d_model), init, std=self.std, rng=resolve_rng(seed, rng))
        self.weight.data = new
        self.weight.zero_grad()
        self.vocab_size = new_v
        self._cache = self._attend_cache = None
        self._loss_cache = None
        return self

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.scale:
            s += ", scale=True"
        if self.weight_dtype is not None:
            s += ", weight_dtype=int8"
        return s + f", dtype={self.dtype}"

