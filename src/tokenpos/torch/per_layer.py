"""PerLayerEmbedding: one (V, L * P) table looked up by token ids and read as L rows of P, as an ``nn.Module``.

The torch twin of :mod:`tokenpos.numpy.per_layer`: the same arguments, scale and ``state_dict`` (``weight``
(V, L * P), HF Gemma 3n / Gemma 4's ``embed_tokens_per_layer.weight`` as it is). The lookup is the token
embedding's op (``tokenpos::embedding`` through :func:`tokenpos.torch.ops.entry.embed`: autograd, compile
and the fused kernels as for ``TokenEmbedding``), the id checks the token embedding's
(:func:`~tokenpos.torch._checks.index_tensor`, then the shared ``TokenIdError`` on the error path).
``weight_dtype=torch.int8`` / ``torch.float8_e4m3fn``: 8-bit rows and per-row scales, dequantised inside the
gather (``tokenpos::quantized_embedding``: numba on the CPU, Triton on CUDA), as the NumPy layer defines it.

Shapes: V vocab, L num_layers, P dim (the per-layer width), ids of any shape (...), out (..., L, P).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.validation import check_bool
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.init import init_weight
from tokenpos.tables.formulas.per_layer import (
    per_layer_args,
    per_layer_multiplier,
    per_layer_repr,
    zero_out_of_range,
)
from tokenpos.torch._checks import (
    _WIDE_UINT_DTYPES,
    DTYPES,
    check_token_id_tensor,
    index_tensor,
    resolve_dtype,
)
from tokenpos.torch._init import empty_table, fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized_,
    quantized_lookup,
    quantized_parameters,
)
from tokenpos.torch.host_table import HostStorage, host_table, table_device
from tokenpos.torch.ops.entry import embed

_COMPARABLE = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)   # dtypes with a ``<`` kernel


def in_table_ids(ids: Any, vocab_size: int, device: torch.device) -> Any:
    """HF Gemma 3n's mapping (``out_of_range="zero"``): ids (...) -> (...) with every id >= V replaced by 0, on
    the ids' device without reading a value (one ``torch.where``). Negative ids pass unchanged for the check
    that follows to refuse. Non-tensors and the wide unsigned dtypes (no compare kernels in torch) are mapped
    by the shared NumPy formula (their values read on the host) and put on ``device``; anything that is not an
    integer tensor passes unchanged to the id check, which names it."""
    if isinstance(ids, torch.Tensor):
        if ids.layout != torch.strided or ids.is_nested:
            return ids
        if ids.dtype in _COMPARABLE:
            t = ids if ids.dtype in (torch.int32, torch.int64) else ids.long()
            return torch.where(t < vocab_size, t, 0)
        if ids.dtype not in _WIDE_UINT_DTYPES:
            return ids                                                         # floats, bool: the check names them
        ids = ids.detach().cpu().numpy()                                       # uint16 / uint32 / uint64
    arr = zero_out_of_range(ids, vocab_size)
    return torch.as_tensor(arr, device=device) if arr.dtype.kind in "iu" else ids


class PerLayerEmbedding(HostStorage, QuantizedTable, TokenposModule):
    """Token ids -> one P-vector per layer, (..., L, P), from a single (V, L * P) table. The torch twin of
    the NumPy layer.

    Args:
        vocab_size: V > 0 (HF: ``vocab_size_per_layer_input``).
        num_layers: L > 0 (HF: ``num_hidden_layers``).
        dim: P > 0 (HF: ``hidden_size_per_layer_input``).
        scale: multiply the rows by ``multiplier``, sqrt(P) rounded as HF rounds it (float32, then the table's
            dtype; :func:`tokenpos.tables.formulas.per_layer.per_layer_multiplier`).
        padding_idx: that row starts at zero and never receives gradient from lookups (HF: ``pad_token_id``).
        out_of_range: "raise" (an id outside [0, V) raises ``TokenIdError``) or "zero" (an id >= V reads
            row 0, as HF Gemma 3n maps multimodal ids; negative ids still raise).
        init, std: the init scheme and the std of the normal ones (as ``TokenEmbedding``).
        sparse: row-sparse ``weight.grad`` (as ``nn.Embedding(sparse=True)``); for a table too large for a dense
            (V, L * P) gradient.
        storage: "device" (the table lives where the layer is moved) or "host": the table stays in host memory and
            only the gathered rows go to the layer's device (``prefetch`` starts that early; a trainable table's
            gradient is then row-sparse on the host, ``sparse=True``). See ``tokenpos.torch.host_table``.
        device, dtype: factory kwargs (dtype: float16, bfloat16, float32, float64; None = default).
        weight_dtype: None (the table is ``dtype``), ``torch.int8`` or ``torch.float8_e4m3fn``: the table is stored
            in 8 bits, ``weight`` (V, L * P) of that dtype and ``weight_scale`` (V,) of ``dtype``, both frozen (a cast
            of the module casts the scales, and so the output, never the 8-bit values); the gathered rows are
            dequantised inside the gather (``tables.formulas.quantize.dequantize_rows``: q * scale * multiplier in
            float32, rounded once). A float ``state_dict`` loaded into the layer is quantised. Inference only: the
            table takes no gradient.
        seed / rng: initialise exactly as the NumPy backend does; otherwise a seed is drawn from
            ``generator`` (or torch's default generator).

    Shape:
        forward: ids (...) int -> (..., L, P).

    state_dict: ``weight`` (V, L * P) (int8 tables: and ``weight_scale`` (V,)).
    """

    def __init__(self, vocab_size: int, num_layers: int, dim: int, *, scale: bool = True,
                 padding_idx: int | None = None, out_of_range: str = "raise", init: str = "normal",
                 std: float = 0.02, sparse: bool = False, storage: str = "device", device: Any = None,
                 dtype: Any = None, weight_dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self._host = host_table(storage, device)        # storage="host": the table stays on the host
        device = table_device(self._host, device)
        (self.vocab_size, self.num_layers, self.dim, self.scale, self.padding_idx, self.out_of_range,
         self.init) = per_layer_args(vocab_size, num_layers, dim, scale, padding_idx, out_of_range, init)
        self.sparse = check_bool("sparse", sparse)
        self.std = std
        # the multiplier of each table dtype, read by the weight's dtype of the moment (a cast changes it)
        self._multipliers = {dt: per_layer_multiplier(self.dim, str(dt).removeprefix("torch."))
                             if self.scale else 1.0 for dt in DTYPES}
        self.weight_dtype = check_weight_dtype(weight_dtype)
        self.quantized = self.weight_dtype is not None
        if self.quantized and self.sparse:
            raise ConfigError("sparse=True is a gradient layout; an 8-bit table takes no gradient")
        shape = (self.vocab_size, self.num_layers * self.dim)
        if self.weight_dtype is not None:
            quantized_parameters(self, shape, self.weight_dtype, resolve_dtype(dtype), device)
        else:
            self.weight = nn.Parameter(empty_table(*shape, device=device, dtype=resolve_dtype(dtype)))
        self.sparse = self.sparse or (self._host is not None and self.weight.requires_grad)   # host: row-sparse
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by: sqrt(P) rounded as HF rounds it for the weight's dtype when
        ``scale`` is set, else 1.0."""
        return self._multipliers[self.weight_scale.dtype if self.quantized else self.weight.dtype]

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an 8-bit table: then quantised); the padding row is zeroed."""
        if not self.quantized:
            fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator), self.padding_idx)
            return
        if self.weight_scale.is_meta:
            return
        fill_quantized_(self, init_weight((self.vocab_size, self.num_layers * self.dim), self.init, std=self.std,
                                          rng=resolve_torch_rng(seed, rng, generator), padding_idx=self.padding_idx))

    def forward(self, ids: Any) -> torch.Tensor:
        """ids (...) -> (..., L, P) = (W[ids] * multiplier) viewed as L rows of P. Bad ids raise TokenIdError
        naming the value, the index and the range, as ``TokenEmbedding``'s do (ids >= V read row 0 with
        ``out_of_range="zero"``)."""
        if self._host is not None:           # storage="host": prefetched rows, or gathered on the host and sent
            return self._host.forward(self, {"ids": ids})
        return self._lookup(ids)

    def _lookup(self, ids: Any) -> torch.Tensor:
        """ids (...) -> (..., L, P): the lookup on the table where it is (forward; a host table's gather)."""
        weight = self.weight
        vocab = self.vocab_size
        if self.out_of_range == "zero":
            ids = in_table_ids(ids, vocab, weight.device)
        ids = index_tensor(ids, vocab, weight)
        try:
            if self.quantized:
                out = quantized_lookup(self, ids, self.multiplier)                                 # (..., L * P)
            elif self.sparse:
                out = F.embedding(ids, weight, self.padding_idx, sparse=True)                   # (..., L * P)
                out = out * self.multiplier if self.scale else out
            else:
                out = embed(weight, ids, None, None, self.multiplier, 0.0, None,
                            -1 if self.padding_idx is None else self.padding_idx)              # (..., L * P)
        except Exception:
            check_token_id_tensor(ids, vocab)         # a bad id the gather met: the shared TokenIdError
            raise
        return out.unflatten(-1, (self.num_layers, self.dim))                                    # (..., L, P)

    def extra_repr(self) -> str:
        s = per_layer_repr(self.vocab_size, self.num_layers, self.dim, self.padding_idx, self.scale, self.out_of_range)
        if self.sparse:
            s += ", sparse=True"
        if self._host is not None:
            s += ", storage='host'"
        if self.quantized:
            return s + f", weight_dtype={self.weight_dtype}, dtype={self.weight_scale.dtype}"
        return s + f", dtype={self.weight.dtype}"
