"""HashedNgramEmbedding: hashed n-gram memory (Engram, arXiv 2601.07372) as an ``nn.Module``; the torch twin of
``tokenpos.numpy.HashedNgramEmbedding`` (same arguments, hashing and state_dict).

Shapes: B batch, L length, T packed tokens, S documents, C context ids (<= n_max - 1), K hash heads
((max_ngram_size - 1) * n_head_per_ngram), Dh = n_embed_per_ngram // n_head_per_ngram, R table rows (the sum of
the heads' primes), E = K * Dh.

    out = weight[offsets + ngram_hash_ids(compress[ids])].reshape(..., E)     (the op ``tokenpos::ngram_embedding``)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.validation import check_bool, check_choice
from tokenpos.tables.formulas.init import INIT_SCHEMES, init_weight
from tokenpos.tables.formulas.ngram_hash import NgramSpec, check_ngram_shapes, ngram_spec
from tokenpos.torch._checks import check_token_id_tensor, resolve_dtype
from tokenpos.torch._init import empty_table, fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized_,
    quantized_lookup,
    quantized_parameters,
    refuse,
)
from tokenpos.torch.host_table import HostStorage, host_of, host_table, table_device
from tokenpos.torch.ops.ngram import fused_on, hashed_rows, ngram_lookup, ngram_lookup_sparse, table_rows
from tokenpos.torch.packing import check_cu_seqlens_tensor


def ngram_inputs(spec: NgramSpec, device: torch.device, ids: Any, cu_seqlens: Any, context: Any
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The checked inputs of a hashed n-gram lookup on ``device``: ids (B, L) / (T,), cu_seqlens (S + 1,) or None,
    context (docs, C) or None (reshaped from (B, C) / (S, C) / (C,)). Bad ids (outside ``compress``'s domain), bad
    ``cu_seqlens`` and shapes that do not fit ``spec`` raise their typed errors naming the value. Shared by
    :class:`HashedNgramEmbedding` and the vocab-parallel layer (``tokenpos.torch.distributed``)."""
    vo = spec.compress.shape[0]
    x = check_token_id_tensor(ids, vo, device=device)
    cu = None
    if cu_seqlens is not None:
        cu = check_cu_seqlens_tensor(cu_seqlens, x.shape[0] if x.dim() == 1 else None, device=device)
    ctx = None if context is None else check_token_id_tensor(context, vo, device=device)
    check_ngram_shapes(spec, tuple(x.shape), cu is not None, None if ctx is None else tuple(ctx.shape),
                       None if cu is None else cu.shape[0] - 1)
    if ctx is not None:
        docs = cu.shape[0] - 1 if cu is not None else (x.shape[0] if x.dim() == 2 else 1)
        ctx = ctx.reshape(docs, ctx.shape[-1])
    return x, cu, ctx


class HashedNgramEmbedding(HostStorage, QuantizedTable, TokenposModule):
    """Hashed n-gram embedding of one layer, with the Engram reference's settings (see the NumPy layer's doc).

    Args:
        engram_vocab_size, max_ngram_size, n_embed_per_ngram, n_head_per_ngram, layer_id, layer_ids, pad_id,
            seed, compress: the reference's settings (``compress``: the old-to-new id array).
        init, std: the table's init scheme ("standard_normal": ``nn.Embedding``'s, as the reference).
        sparse: row-sparse ``weight.grad`` (as ``nn.Embedding(sparse=True)``): on the CPU kernels the fused lookup,
            whose backward sums each looked-up row once (``ops.ngram.ngram_lookup_sparse``); elsewhere the hashed
            rows, then ``F.embedding``.
        storage: "device" (the table lives where the layer is moved) or "host": the table stays in host memory and
            only the gathered rows go to the layer's device (``prefetch`` starts that early; the gradient is then
            row-sparse on the host, ``sparse=True``). See ``tokenpos.torch.host_table``.
        device, dtype: factory kwargs. init_seed / rng: initialise exactly as the NumPy backend does; otherwise a
            seed is drawn from ``generator`` (or torch's default generator).
        weight_dtype: None (the table is ``dtype``), ``torch.int8`` or ``torch.float8_e4m3fn``: the table is stored
            in 8 bits, ``weight`` (R, Dh) of that dtype and ``weight_scale`` (R,) of ``dtype``, both frozen; the
            hashed rows (``hashed_rows``) are then gathered and dequantised in one pass
            (``tokenpos::quantized_embedding``; definition ``tables.formulas.quantize.dequantize_rows``, multiplier 1).
            A float ``state_dict`` loaded into the layer is quantised. Inference only (``sparse=True`` refused).

    Shape:
        forward: ids (B, L) -> (B, L, E); packed ids (T,) with ``cu_seqlens`` (S + 1,) -> (T, E);
        ``context`` (B, C) / (S, C): the ids right before each sequence (decoding).

    state_dict: ``weight`` (R, Dh). The hashing tables are non-persistent buffers (they follow ``.to(device)``).
    """

    compress: torch.Tensor
    multipliers: torch.Tensor
    primes: torch.Tensor
    offsets: torch.Tensor

    def __init__(self, *, engram_vocab_size: Any, max_ngram_size: int, n_embed_per_ngram: int,
                 n_head_per_ngram: int, layer_id: int, layer_ids: Any, pad_id: int, seed: int, compress: Any,
                 init: str = "standard_normal", std: float = 0.02, sparse: bool = False, storage: str = "device",
                 device: Any = None, dtype: Any = None, weight_dtype: Any = None,
                 init_seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self._host = host_table(storage, device)        # storage="host": the table stays on the host
        device = table_device(self._host, device)
        self.sparse = check_bool("sparse", sparse)
        if isinstance(compress, torch.Tensor):
            compress = compress.detach().cpu().numpy()
        self.spec = ngram_spec(engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size,
                               n_embed_per_ngram=n_embed_per_ngram, n_head_per_ngram=n_head_per_ngram,
                               layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed, compress=compress)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        for name in ("compress", "multipliers", "primes", "offsets"):
            self.register_buffer(name, torch.tensor(np.array(getattr(self.spec, name)), device=device),
                                 persistent=False)
        self.weight_dtype = check_weight_dtype(weight_dtype)
        if self.weight_dtype is not None:
            if self.sparse:
                raise refuse(self, "sparse=True (a gradient layout)", self.weight_dtype)
            quantized_parameters(self, (self.spec.num_rows, self.spec.head_dim), self.weight_dtype,
                                 resolve_dtype(dtype), device)
        else:
            self.weight = nn.Parameter(empty_table(self.spec.num_rows, self.spec.head_dim, device=device,
                                                   dtype=resolve_dtype(dtype)))
        self.sparse = self.sparse or (self._host is not None and self.weight.requires_grad)   # host: row-sparse
        self.reset_parameters(seed=init_seed, rng=rng, generator=generator)

    @property
    def out_dim(self) -> int:
        """E = (max_ngram_size - 1) * n_embed_per_ngram."""
        return self.spec.out_dim

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an 8-bit table: then quantised)."""
        if self.weight_dtype is None:
            fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator))
        elif not self.weight_scale.is_meta:
            fill_quantized_(self, init_weight((self.spec.num_rows, self.spec.head_dim), self.init, std=self.std,
                                              rng=resolve_torch_rng(seed, rng, generator)))

    def _inputs(self, ids: Any, cu_seqlens: Any, context: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return ngram_inputs(self.spec, self.weight.device, ids, cu_seqlens, context)

    def hash_rows(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) / (T,) -> (..., K) int64 table rows (the reference's hash ids plus the heads' offsets)."""
        x, cu, ctx = self._inputs(ids, cu_seqlens, context)
        return table_rows(x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)

    def forward(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) -> (B, L, E), or packed (T,) with ``cu_seqlens`` -> (T, E); ``context``: the ids right before
        each sequence. Bad ids (outside compress's domain) raise TokenIdError naming the value."""
        if self._host is not None:           # storage="host": prefetched rows, or gathered on the host and sent
            return self._host.forward(self, {"ids": ids, "cu_seqlens": cu_seqlens, "context": context})
        return self._lookup(ids, cu_seqlens=cu_seqlens, context=context)

    def _lookup(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """(B, L) -> (B, L, E) / (T,) -> (T, E): the lookup on the table where it is (forward; a host table's
        gather)."""
        x, cu, ctx = self._inputs(ids, cu_seqlens, context)
        if self.weight_dtype is not None:                 # 8 bits: the hashed rows, dequantised inside the gather
            rows = hashed_rows(x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)
            return quantized_lookup(self, rows, 1.0).flatten(-2)                                  # (..., K * Dh)
        if self.sparse and fused_on(self.weight) and not torch.compiler.is_compiling():   # the kernel's both ways
            return ngram_lookup_sparse(self.weight, x, cu, ctx, self.compress, self.multipliers, self.primes,
                                       self.offsets, self.spec.pad)
        if self.sparse:                                   # row-sparse gradient: the rows, then F.embedding
            rows = hashed_rows(x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)
            return F.embedding(rows, self.weight, sparse=True).flatten(-2)                       # (..., K * Dh)
        return ngram_lookup(self.weight, x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets,
                            self.spec.pad)                   # the op's implementation, its dispatcher skipped

    # -- storage="host" ----------------------------------------------------------------------
    def prefetch(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> None:
        """Gather the rows of host ids (with host ``cu_seqlens`` / ``context``, as ``forward`` takes them) now and
        start their copy to the output device; the next ``forward`` (not served by an older prefetch) returns them,
        after checking its inputs are these. storage="host" only (``tokenpos.torch.host_table``)."""
        host_of(self).prefetch(self, {"ids": ids, "cu_seqlens": cu_seqlens, "context": context})

    def extra_repr(self) -> str:
        s = self.spec
        return (f"max_ngram_size={s.max_ngram_size}, heads={s.num_heads}, head_dim={s.head_dim}, "
                f"rows={s.num_rows}{', sparse=True' if self.sparse else ''}"
                f"{', storage=' + repr('host') if self._host is not None else ''}"
                f"{', weight_dtype=' + str(self.weight_dtype) if self.weight_dtype is not None else ''}"
                f", dtype={self.weight_scale.dtype if self.weight_dtype is not None else self.weight.dtype}")
