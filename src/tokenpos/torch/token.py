"""TokenEmbedding: the (V, D) lookup table and the tied output projection, as an ``nn.Module``.

Shapes: V vocab, D d_model, ids of any shape (...), h (..., D), logits (..., V).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.tied_loss import check_same_dtype
from tokenpos.tables.checks.token_table import check_resize, check_table_shape
from tokenpos.tables.checks.validation import (
    check_bool,
    check_choice,
    check_feature_dim,
    check_padding_idx,
    check_positive_int,
)
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.init import INIT_SCHEMES, RESIZE_INITS, init_weight
from tokenpos.torch._checks import check_float_tensor, check_token_id_tensor, index_tensor, resolve_dtype
from tokenpos.torch._init import empty_table, fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized_,
    quantized_attend,
    quantized_lookup,
    quantized_parameters,
    refuse,
)
from tokenpos.torch.host_table import HostStorage, host_table, table_device
from tokenpos.torch.ops import embed
from tokenpos.torch.tied_loss import tied_cross_entropy


def token_rows(token: TokenEmbedding, ids: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``W[ids] * multiplier`` (...) -> (..., D) for ids of an index dtype (``index_tensor``): the
    ``tokenpos::embedding`` op, or ``F.embedding`` for a ``sparse=True`` table (row-sparse gradient).
    ``weight``: ``token.weight`` when the caller has read it already (a parameter read is a
    ``__getattr__``)."""
    w = token.weight if weight is None else weight
    if token.weight_dtype is not None:                                                    # 8 bits, dequantised
        return quantized_lookup(token, ids, token.multiplier)                            # (..., D)
    if token.sparse:
        out = F.embedding(ids, w, token.padding_idx, sparse=True)                           # (..., D)
        return out * token.multiplier if token.scale else out
    return embed(w, ids, None, None, token.multiplier, 0.0, None, _pad(token.padding_idx))


def _pad(padding_idx: int | None) -> int:
    """The op's spelling of padding_idx: -1 for none."""
    return -1 if padding_idx is None else padding_idx


class TokenEmbedding(HostStorage, QuantizedTable, TokenposModule):
    """Token ids -> vectors, optionally scaled by sqrt(d_model). The torch twin of the NumPy layer.

    Args:
        vocab_size: V > 0.
        d_model: D > 0.
        init: "normal" (N(0, std)), "trunc_normal" (+-2 std), "xavier_uniform", "standard_normal", "zeros".
        std: the std of the normal schemes.
        scale: multiply the output by sqrt(D) (Vaswani et al.).
        padding_idx: that row starts at zero and never receives gradient from lookups.
        sparse: row-sparse ``weight.grad`` (as ``nn.Embedding(sparse=True)``).
        storage: "device" (the table lives where the layer is moved) or "host": the table stays in host memory and
            only the gathered rows go to the layer's device (``prefetch`` starts that early; a trainable table's
            gradient is then row-sparse on the host, ``sparse=True``). See ``tokenpos.torch.host_table``.
        device, dtype: factory kwargs (dtype: float16, bfloat16, float32, float64; None = default).
        weight_dtype: None (the table is ``dtype``), ``torch.int8`` or ``torch.float8_e4m3fn``: the table is stored
            in 8 bits, ``weight`` (V, D) of that dtype and ``weight_scale`` (V,) of ``dtype``, both frozen; a lookup
            dequantises the gathered rows inside the gather (``tokenpos::quantized_embedding``; the definition is
            ``tables.formulas.quantize.dequantize_rows``). Initial weights are drawn, then quantised; a float
            ``state_dict`` loaded into the layer (or ``from_pretrained(..., weight_dtype=)``) is quantised.
            Inference only: ``attend`` works (logits against the dequantised table, a block of rows at a time,
            no float (V, D) copy kept); ``loss``, ``resize`` and ``sparse=True`` raise ConfigError.
        seed / rng: initialise exactly as the NumPy backend does; otherwise a seed is drawn from
            ``generator`` (or torch's default generator, so ``torch.manual_seed`` reproduces it).

    Shape:
        forward: ids (...) int -> (..., D). attend: h (..., D) -> logits (..., V).

    state_dict: ``weight`` (V, D) (8-bit tables: and ``weight_scale`` (V,)).
    """

    def __init__(self, vocab_size: int, d_model: int, *, init: str = "normal", std: float = 0.02,
                 scale: bool = False, padding_idx: int | None = None, sparse: bool = False, storage: str = "device",
                 device: Any = None, dtype: Any = None, weight_dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self._host = host_table(storage, device)        # storage="host": the table stays on the host
        device = table_device(self._host, device)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        self.padding_idx = check_padding_idx(padding_idx, self.vocab_size)
        self.scale = check_bool("scale", scale)
        self.sparse = bool(sparse)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        self.weight_dtype = check_weight_dtype(weight_dtype)
        if self.weight_dtype is not None:
            if self.sparse:
                raise refuse(self, "sparse=True (a gradient layout)", self.weight_dtype)
            quantized_parameters(self, (self.vocab_size, self.d_model), self.weight_dtype, resolve_dtype(dtype),
                                 device)
        else:
            self.weight = nn.Parameter(empty_table(self.vocab_size, self.d_model, device=device,
                                                   dtype=resolve_dtype(dtype)))
        self.sparse = self.sparse or (self._host is not None and self.weight.requires_grad)   # host: row-sparse
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by: sqrt(D) when the bool ``scale`` is set, else 1.0."""
        return math.sqrt(self.d_model) if self.scale else 1.0

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an 8-bit table: then quantised); the padding row is zeroed."""
        if self.weight_dtype is None:
            fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator), self.padding_idx)
        elif not self.weight_scale.is_meta:
            w = init_weight((self.vocab_size, self.d_model), self.init, std=self.std,
                            rng=resolve_torch_rng(seed, rng, generator), padding_idx=self.padding_idx)
            fill_quantized_(self, w)

    @classmethod
    def from_pretrained(cls, weights: Any, *, freeze: bool = True, padding_idx: int | None = None,
                        scale: bool = False, sparse: bool = False, storage: str = "device", device: Any = None,
                        dtype: Any = None, weight_dtype: Any = None) -> TokenEmbedding:
        """Wrap an existing (V, D) tensor or array (copied). ``freeze=True`` makes it non-trainable.
        ``weight_dtype`` (int8 / float8_e4m3fn): the float table quantised, frozen (``freeze=False`` is refused);
        ``dtype`` then is the scales' (and the output's) dtype, by default the table's."""
        w = weights.detach() if isinstance(weights, torch.Tensor) else torch.as_tensor(np.asarray(weights))
        check_table_shape(tuple(w.shape))
        quantized = check_weight_dtype(weight_dtype)
        if quantized is not None:
            if not freeze or not w.dtype.is_floating_point or w.dtype in (torch.int8, torch.float8_e4m3fn):
                raise refuse(cls, "freeze=False (training)" if not freeze else f"a {w.dtype} table",
                             quantized)
            layer = cls(w.shape[0], w.shape[1], init="zeros", padding_idx=padding_idx, scale=scale, storage=storage,
                        device=device if device is not None else w.device, dtype=resolve_dtype(
                            w.dtype if dtype is None else dtype), weight_dtype=quantized, seed=0)
            fill_quantized_(layer, w)
            return layer
        dtype = resolve_dtype(w.dtype if dtype is None else dtype)
        layer = cls(w.shape[0], w.shape[1], init="zeros", padding_idx=padding_idx, scale=scale, sparse=sparse,
                    storage=storage, device=device if device is not None else w.device, dtype=dtype, seed=0)
        with torch.no_grad():
            layer.weight.copy_(w)
        layer.weight.requires_grad_(not freeze)
        return layer

    # -- lookup ------------------------------------------------------------------------------
    def forward(self, ids: Any) -> torch.Tensor:
        """ids (...) -> (..., D) = W[ids] * multiplier. Bad ids raise TokenIdError naming the value, the index and
        the range: read where they are gathered (``ops.embed``), then named by the shared check."""
        if self._host is not None:           # storage="host": prefetched rows, or gathered on the host and sent
            return self._host.forward(self, {"ids": ids})
        return self._lookup(ids)

    def _lookup(self, ids: Any) -> torch.Tensor:
        """ids (...) -> (..., D): the lookup on the table where it is (forward; a host table's gather)."""
        weight = self.weight
        ids = index_tensor(ids, self.vocab_size, weight)
        try:
            return token_rows(self, ids, weight)
        except Exception:
            check_token_id_tensor(ids, self.vocab_size)      # a bad id the gather met: the shared TokenIdError
            raise

    # -- storage="host" (prefetch, clear_prefetch: HostStorage) -----------------------------------
    def _whole_table(self, what: str) -> None:
        """``attend`` / ``loss`` read every row: refused for a table kept on the host of a model on a device."""
        if self._host is not None and self._host.device.type != "cpu":
            raise ConfigError(f"TokenEmbedding.{what} reads the whole table, which storage='host' keeps on the host "
                              f"while the model runs on {self._host.device}; expected storage='device' for a tied "
                              "output layer")

    # -- tied output projection --------------------------------------------------------------
    def attend(self, h: torch.Tensor) -> torch.Tensor:
        """Logits against the same table: h (..., D) -> (..., V) = h @ W.T (flax's ``attend``).

        Like a tied ``nn.Linear``, every row (the padding row included) receives gradient here.

        Raises:
            DtypeError: h of another dtype than the table (as ``loss``), outside ``torch.autocast`` (which casts).
        """
        check_float_tensor("h", h)
        check_feature_dim("h", tuple(h.shape), self.d_model)
        self._whole_table("attend")
        if self.weight_dtype is not None:                      # 8 bits: a block of dequantised rows at a time
            return quantized_attend(self, h)
        if h.dtype != self.weight.dtype and not torch.is_autocast_enabled(h.device.type):
            check_same_dtype(h.dtype, self.weight.dtype)                       # raises
        return F.linear(h, self.weight)

    def loss(self, h: torch.Tensor, targets: Any, *, ignore_index: int = -100, label_smoothing: float = 0.0,
             reduction: str = "mean", softcap: float | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """The tied output layer's cross-entropy without the logits: h (..., D), targets (...) -> loss () or (...).

        ``tokenpos.torch.tied_cross_entropy(h, self.weight, targets, ...)``: gradients reach h and the whole
        table (every row, the padding row included, as in ``attend``). Raises as that function does.
        """
        check_float_tensor("h", h)
        check_feature_dim("h", tuple(h.shape), self.d_model)
        self._whole_table("loss")
        if self.weight_dtype is not None:
            raise refuse(self, "loss (the tied loss trains the table)", self.weight_dtype)
        return tied_cross_entropy(h, self.weight, targets, ignore_index=ignore_index,
                                  label_smoothing=label_smoothing, reduction=reduction, softcap=softcap,
                                  chunk_size=chunk_size)

    # -- resizing ----------------------------------------------------------------------------
    @torch.no_grad()
    def resize(self, new_vocab_size: int, *, pad_to_multiple_of: int | None = None, init: str = "mean",
               allow_shrink: bool = False, seed: int | None = None, rng: np.random.Generator | None = None,
               generator: torch.Generator | None = None) -> TokenEmbedding:
        """Grow (or, with ``allow_shrink=True``, cut) the vocabulary in place; returns self.

        New rows are the mean of the old rows (``init="mean"``, computed in float64, as HF does for
        added tokens) or drawn from an init scheme. ``pad_to_multiple_of`` rounds the new size up.
        ``weight`` becomes a new Parameter (same requires_grad): rebuild optimisers that held the old one.
        """
        if self.weight_dtype is not None:
            raise refuse(self, "resize", self.weight_dtype)
        new_v = check_resize(self.vocab_size, new_vocab_size, pad_to_multiple_of=pad_to_multiple_of, init=init,
                             inits=RESIZE_INITS, allow_shrink=allow_shrink, padding_idx=self.padding_idx)
        old = self.weight
        keep = min(new_v, self.vocab_size)
        new = empty_table(new_v, self.d_model, device=old.device, dtype=old.dtype)
        new[:keep] = old[:keep]
        if new_v > keep:
            if init == "mean":
                new[keep:] = old.to(torch.float64).mean(dim=0)
            else:
                rows = init_weight((new_v - keep, self.d_model), init, std=self.std,
                                   rng=resolve_torch_rng(seed, rng, generator))
                new[keep:] = torch.from_numpy(rows)
        self.weight = nn.Parameter(new, requires_grad=old.requires_grad)
        self.vocab_size = new_v
        return self

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.scale:
            s += ", scale=True"
        if self.sparse:
            s += ", sparse=True"
        if self._host is not None:
            s += ", storage='host'"
        if self.weight_dtype is not None:
            return s + f", weight_dtype={self.weight_dtype}, dtype={self.weight_scale.dtype}"
        return s + f", dtype={self.weight.dtype}"
