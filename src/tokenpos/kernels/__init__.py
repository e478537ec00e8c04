"""Fused CPU kernels (numba, ``cache=True``, parallel over rows), each with a plain-NumPy twin.

Importing this package imports numba but compiles nothing; each kernel compiles (or loads from
numba's on-disk cache in ``__pycache__``) on its first call with a given dtype combination.

Public kernels (all take and return NumPy arrays; torch callers pass zero-copy ``.numpy()`` views,
including for ``out=``):

Embedding (:mod:`.embedding`), N ids of any shape (...), D model dim, P positions:

- ``embedding_forward(weight (V, D), ids (...), *, scale=1.0, pos_table=None (P, D),
  pos_ids=None ((...) or a trailing part), dropout_p=0.0, seed=0, dropout_offset=0, out=None,
  bf16=False) -> (..., D)``: gather * scale + positional row, then
  counter-based dropout (``x * m``), in one pass; every argument checked first (the shared
  messages); ``bf16=True`` takes bf16 bits as uint16 arrays.
- ``embedding.forward_rows(w, ids, pt, pos, scale, p, seed, out)``: the same pass on inputs a layer
  has checked (the entry both backends' ops call); the core still bounds every row and
  ``KernelBoundError`` reports a row it skipped.
- ``embedding_backward(grad_out (..., D), ids (...), *, scale=1.0, dropout_p=0.0, seed=0,
  dropout_offset=0, padding_idx=None, pos_ids=None, num_positions=None)
  -> (unique_ids (U,), rows (U, D), pos_grad (P, D) | None)``: row-sparse token gradient.

RoPE (:mod:`.rope`), q (B, H, L, Dh), k (B, Hk, L, Dh), cos/sin (L, R/2) or (B, L, R/2), or one (P, R/2)
table read at ``positions`` (L,) / (1, L) / (B, L) in [0, P):

- ``rope_apply(q, k, cos, sin, *, layout="half"|"interleaved", out_q=None, out_k=None, positions=None) -> (q, k)``
- ``rope_apply_backward(grad_q, grad_k, cos, sin, *, layout, out_q=None, out_k=None, positions=None) -> (gq, gk)``

Packed documents (:mod:`.packing`), ``cu_seqlens`` (N + 1,):

- ``packing.document_positions(cu_seqlens, total) -> (positions (T,) int64, longest document)``: the
  layers' packed positions, checked, in one compiled pass (twin: ``tables.formulas.packing``).

Hashed n-gram lookup (:mod:`.ngram`, Engram), ids (B, L) / packed (T,), K hash heads, Dh head width:

- ``ngram_forward`` / ``ngram_rows`` / ``ngram_backward``: hash and gather in one pass (no (T, K) index array),
  the (..., K) table rows alone, and the row-sparse gradient (twin: ``tables.formulas.ngram_hash``).

8-bit tables (:mod:`.quantized`), q (V, C) int8 or float8 e4m3fn bits (uint8), scale (V,):

- ``quantized_embedding(q, scale, ids (...), multiplier=1.0, *, out=None) -> (..., C)``: gather and dequantise
  in one pass (twin: ``tables.formulas.quantize.dequantize_rows``, equal bit for bit).

Row-sparse optimisers (:mod:`.optim`), in place, ``mode="exact"|"lazy"``:

- ``sparse_adam_update(param, exp_avg, exp_avg_sq, indices, rows, *, step, lr, beta1=0.9,
  beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False, mode="lazy")``
- ``sparse_sgd_update(param, indices, rows, *, lr, momentum=0.0, dampening=0.0, nesterov=False,
  weight_decay=0.0, momentum_buffer=None, first_step=False, mode="lazy")``

The tied loss has no CPU kernel: both backends run its blocks as plain torch / NumPy ops (a numba
block kernel measured no faster and was deleted, issue 33); its CUDA block kernel is
``triton.tied_loss``, whose NumPy twin ``reference.tied_loss_block_ref`` is that kernel's test oracle.

Every kernel ``f`` but the n-gram and 8-bit ones (twins named above) has a twin ``f_ref`` in :mod:`.reference`
with the same signature; the
optimisers' twins are dense (``adam_dense_ref``, ``sgd_dense_ref``) and lazy (``*_lazy_ref``).
Dropout masks equal :func:`tokenpos.tables.formulas.dropout.dropout_keep_mask` bit for bit; forwards equal
their twins bit for bit; sums and optimiser steps agree to float rounding.

Machinery (private): :mod:`._threading` (the numba threading layer, chosen once at import: torch's
own OpenMP pool when torch is loaded, else TBB; fork-safe and thread-safe), :mod:`._forward` (the
compiled forward core, float and bf16), :mod:`._rng` (the hash), :mod:`._prefetch` (software
prefetch), :mod:`._launch` (dynamic chunks for the backward and optimiser loops). ``out=None``
takes a fresh output from :data:`tokenpos._config.OUTPUTS` (reused released blocks, no page faults);
callers may pass ``out=``. tokenpos never changes numba's thread count.

Numba's on-disk cache (``cache=True``) lives in ``__pycache__`` next to these files (or numba's
user cache directory when that is not writable). It is keyed on each file's own source, so after
editing ``_rng.py`` / ``_prefetch.py`` / ``_forward.py`` clear ``__pycache__``
(functions inlined from them are not tracked across files).
"""

from __future__ import annotations

from tokenpos.kernels import _threading

_threading.configure()      # before any kernel launches: numba fixes its layer at the first launch

from tokenpos.kernels.embedding import embedding_backward, embedding_forward  # noqa: E402
from tokenpos.kernels.optim import sparse_adam_update, sparse_sgd_update  # noqa: E402
from tokenpos.kernels.rope import rope_apply, rope_apply_backward  # noqa: E402

__all__ = [
    "embedding_backward",
    "embedding_forward",
    "rope_apply",
    "rope_apply_backward",
    "sparse_adam_update",
    "sparse_sgd_update",
]
