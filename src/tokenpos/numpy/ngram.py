"""HashedNgramEmbedding: hashed n-gram memory (Engram, arXiv 2601.07372), one table with per-head offsets.

Shapes: B batch, L length, T packed tokens, S documents, C context ids (<= n_max - 1), K hash heads
((max_ngram_size - 1) * n_head_per_ngram), Dh = n_embed_per_ngram // n_head_per_ngram, R table rows (the sum of
the heads' primes), E = K * Dh = (max_ngram_size - 1) * n_embed_per_ngram.

    rows = offsets + ngram_hash_ids(compress[ids])           (B, L, K)  (tables.formulas.ngram_hash)
    out  = weight[rows].reshape(B, L, E)

The reference's ``NgramHashMapping`` + ``MultiHeadEmbedding`` (deepseek-ai/Engram ``engram_demo_v1.py``) for one
layer; float32 / float64 tables run the fused kernel (:mod:`tokenpos.kernels.ngram`: hash and gather in one pass),
other dtypes and kernels off the formula. The backward is row-sparse (the lazy optimisers update only the rows a
step touched).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos._config import OUTPUTS, kernels_enabled
from tokenpos.kernels import ngram as kernel
from tokenpos.numpy._quantized import (
    QuantizedTable,
    check_weight_dtype,
    fill_quantized,
    quantized_lookup,
    quantized_parameters,
    refuse,
)
from tokenpos.numpy.functional._dispatch import compute_dtype, use_kernel
from tokenpos.numpy.module import Parameter, coalesce_rows
from tokenpos.tables.checks.validation import check_dtype, check_grad
from tokenpos.tables.formulas.init import init_weight, resolve_rng
from tokenpos.tables.formulas.ngram_hash import NgramSpec, check_ngram_inputs, ngram_hash_ids, ngram_spec


@dataclass(frozen=True)
class NgramCache:
    """What :func:`ngram_backward` needs: private copies of the forward's ids, cu_seqlens and context."""

    ids: np.ndarray
    cu_seqlens: np.ndarray | None
    context: np.ndarray | None


def ngram_rows(spec: NgramSpec, ids: np.ndarray, cu_seqlens: np.ndarray | None = None,
               context: np.ndarray | None = None) -> np.ndarray:
    """Checked ids (B, L) / (T,) -> (..., K) table rows (hash ids plus the heads' offsets), by the formula."""
    comp = spec.compress
    ctx = None if context is None else comp[context]
    return ngram_hash_ids(comp[ids], spec.multipliers, spec.primes, spec.pad, cu_seqlens=cu_seqlens,
                          context=ctx) + spec.offsets


def quantized_rows(spec: NgramSpec, ids: np.ndarray, cu_seqlens: np.ndarray | None = None,
                   context: np.ndarray | None = None) -> np.ndarray:
    """Checked ids -> (..., K) table rows for an 8-bit table's gather: the numba rows kernel with kernels on, else
    the formula (:func:`ngram_rows`); the same rows."""
    if not kernels_enabled():
        return ngram_rows(spec, ids, cu_seqlens, context)
    return kernel.ngram_rows(np.ascontiguousarray(ids, dtype=np.int64), spec.compress, spec.multipliers, spec.primes,
                             spec.offsets, spec.pad, cu_seqlens=cu_seqlens, context=context)


def ngram_forward(weight: np.ndarray, spec: NgramSpec, ids: np.ndarray, cu_seqlens: np.ndarray | None = None,
                  context: np.ndarray | None = None) -> tuple[np.ndarray, NgramCache]:
    """weight (R, Dh), checked ids (B, L) / (T,) -> (out (..., E) in weight's dtype, cache)."""
    cache = NgramCache(np.array(ids, copy=True), None if cu_seqlens is None else np.array(cu_seqlens, copy=True),
                       None if context is None else np.array(context, copy=True))
    shape = (*ids.shape, spec.out_dim)
    if use_kernel(weight):                      # a large output from the released blocks (no page faults)
        small = math.prod(shape) * weight.dtype.itemsize < OUTPUTS.min_bytes
        out = np.empty(shape, weight.dtype) if small else OUTPUTS.empty(shape, weight.dtype)
        kernel.ngram_forward(np.ascontiguousarray(weight), ids, spec.compress, spec.multipliers, spec.primes,
                             spec.offsets, spec.pad, out, cu_seqlens=cu_seqlens, context=context)
        return out, cache
    return weight[ngram_rows(spec, ids, cu_seqlens, context)].reshape(shape), cache


def ngram_backward(dout: np.ndarray, spec: NgramSpec, cache: NgramCache) -> tuple[np.ndarray, np.ndarray]:
    """dout (..., E) -> (rows (U,) int64 sorted unique, summed gradient slices (U, Dh) in dout's dtype):
    ``grad_weight[rows[j]]`` is the sum of every (token, head) slice of dout whose row is ``rows[j]``."""
    if use_kernel(dout):
        return kernel.ngram_backward(dout, cache.ids, spec.compress, spec.multipliers, spec.primes, spec.offsets,
                                     spec.pad, cu_seqlens=cache.cu_seqlens, context=cache.context)
    rows = ngram_rows(spec, cache.ids, cache.cu_seqlens, cache.context).reshape(-1)          # (T * K,)
    g = dout.astype(compute_dtype(dout.dtype)).reshape(-1, spec.head_dim)                   # (T * K, Dh)
    sparse = coalesce_rows(rows, g)
    return sparse.indices, sparse.rows.astype(dout.dtype, copy=False)


class HashedNgramEmbedding(QuantizedTable):
    """Hashed n-gram embedding of one layer, with the Engram reference's settings.

    Args:
        engram_vocab_size: the table size per n (a list, n = 2..max_ngram_size); each head's prime is the next
            unused prime above it.
        max_ngram_size: n_max >= 2. n_embed_per_ngram: width per n (a multiple of n_head_per_ngram).
        n_head_per_ngram: H hash heads per n. layer_id: this layer; layer_ids: every Engram layer (the primes are
            distinct across all of them, so a layer's depend on the layers before it).
        pad_id: the (uncompressed) id that fills n-grams before a sequence's start.
        seed: the hashing seed (the multipliers of layer i come from ``seed + 10007 * i``).
        compress: (Vo,) integer old-to-new id array (the reference's ``CompressedTokenizer.lookup_table``).
        init, std: the table's init scheme ("standard_normal": ``nn.Embedding``'s, as the reference).
        dtype: float16, float32 (default) or float64. init_seed / rng: the explicit source of the initial weights.
        weight_dtype: None (the table is ``dtype``) or ``np.int8`` / "int8": the table is stored in 8 bits, ``weight``
            (R, Dh) int8 and ``weight_scale`` (R,) of ``dtype``, both frozen; a lookup hashes the rows, then gathers
            and dequantises them in one pass (``tables.formulas.quantize.dequantize_rows``, multiplier 1). A float
            ``state_dict`` loaded into the layer is quantised. Inference only: ``backward`` raises ConfigError.

    Shape:
        forward: ids (B, L) -> (B, L, E); packed ids (T,) with ``cu_seqlens`` (S + 1,) -> (T, E);
        ``context`` (B, C) / (S, C): the C <= n_max - 1 ids right before each sequence (decoding).

    state_dict: ``weight`` (R, Dh), R the sum of the heads' primes.
    """

    def __init__(self, *, engram_vocab_size: Any, max_ngram_size: int, n_embed_per_ngram: int,
                 n_head_per_ngram: int, layer_id: int, layer_ids: Any, pad_id: int, seed: int, compress: Any,
                 init: str = "standard_normal", std: float = 0.02, dtype: Any = np.float32, weight_dtype: Any = None,
                 init_seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.spec = ngram_spec(engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size,
                               n_embed_per_ngram=n_embed_per_ngram, n_head_per_ngram=n_head_per_ngram,
                               layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed, compress=compress)
        self.settings = dict(engram_vocab_size=list(engram_vocab_size), max_ngram_size=max_ngram_size,
                             n_embed_per_ngram=n_embed_per_ngram, n_head_per_ngram=n_head_per_ngram,
                             layer_id=layer_id, layer_ids=list(layer_ids), pad_id=pad_id, seed=seed)
        self.init, self.std = init, std
        self.dtype = check_dtype("dtype", dtype)
        self.weight_dtype = check_weight_dtype(weight_dtype)
        if self.weight_dtype is not None:
            quantized_parameters(self, (self.spec.num_rows, self.spec.head_dim), self.dtype)
        else:
            self.weight = Parameter(np.empty((self.spec.num_rows, self.spec.head_dim), self.dtype))
        self.reset_parameters(rng=resolve_rng(init_seed, rng))
        self._cache: NgramCache | None = None

    @property
    def out_dim(self) -> int:
        """E = (max_ngram_size - 1) * n_embed_per_ngram."""
        return self.spec.out_dim

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Re-draw the table from its init scheme (an 8-bit table: then quantised)."""
        w = init_weight(self.weight.data.shape, self.init, std=self.std, rng=resolve_rng(seed, rng))
        if self.weight_dtype is not None:
            fill_quantized(self, w)
            return
        self.weight.data[...] = w
        self.weight.zero_grad()

    def hash_rows(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> np.ndarray:
        """ids (B, L) / (T,) -> (..., K) int64 table rows (the reference's hash ids plus the heads' offsets)."""
        x, cu, ctx = check_ngram_inputs(self.spec, ids, cu_seqlens, context)
        return ngram_rows(self.spec, x, cu, ctx)

    def forward(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> np.ndarray:
        """ids (B, L) -> (B, L, E), or packed (T,) with ``cu_seqlens`` -> (T, E); ``context``: the ids right
        before each sequence. Bad ids (outside compress's domain) raise TokenIdError naming the value, before
        anything is kept."""
        x, cu, ctx = check_ngram_inputs(self.spec, ids, cu_seqlens, context)
        if self.weight_dtype is not None:                  # 8 bits: the hashed rows, dequantised in the gather
            self._cache = None
            rows = quantized_rows(self.spec, x, cu, ctx)                                        # (..., K)
            out = quantized_lookup(self.weight.data, self.weight_scale.data, rows, 1.0)         # (..., K, Dh)
            return out.reshape(*x.shape, self.spec.out_dim)
        out, self._cache = ngram_forward(self.weight.data, self.spec, x, cu, ctx)
        return out

    def backward(self, grad_output: np.ndarray) -> None:
        """Accumulate the row-sparse gradient of the last forward; returns None (ids are not float)."""
        if self.weight_dtype is not None:
            raise refuse(self, "backward")
        cache = self._cached(self._cache)
        grad = check_grad("grad_output", grad_output, cache.ids.shape + (self.spec.out_dim,))
        if self.weight.requires_grad:
            rows, summed = ngram_backward(grad.astype(self.dtype, copy=False), self.spec, cache)
            self.weight.accumulate_rows(rows, summed, coalesced=True)

    def extra_repr(self) -> str:
        s = self.settings
        return (f"max_ngram_size={s['max_ngram_size']}, n_embed_per_ngram={s['n_embed_per_ngram']}, "
                f"n_head_per_ngram={s['n_head_per_ngram']}, layer_id={s['layer_id']}, rows={self.spec.num_rows}, "
                f"{'weight_dtype=int8, ' if self.weight_dtype is not None else ''}dtype={self.dtype}")
