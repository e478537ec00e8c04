"""Triton kernels for CUDA tensors: fused embedding forward/backward, RoPE on q and k, vocab-parallel cross-entropy.

Importing this package imports ``triton`` (the optional ``gpu`` extra); nothing else in tokenpos does
so eagerly: the torch ops import it lazily for CUDA tensors. All functions take and return torch
tensors on one device. On the CPU the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this package is imported), which is how the tests run them.

Shapes: V vocab, D model dim, P positional rows, (...) any ids shape, B batch, H / Hk heads, L length,
Dh head dim, F rotary pairs (rotary dim R = 2F <= Dh).

- ``embedding_forward(weight (V, D), ids (...), table (P, D) | None, pos | None, scale, p, seed,
  *, offset=0) -> (..., D)``: ``(w[ids] * scale + table[pos]) * m`` with the counter-hash dropout
  multiplier m of :mod:`tokenpos.tables.formulas.dropout` (bit-identical mask).
- ``embedding_backward(grad (..., D), ids, pos | None, num_weights, num_positions, scale, p, seed,
  padding_idx=-1, *, offset=0) -> (grad_weight (V, D), grad_table (P, D) | None)``: sorted segment
  sums in fp32, each row written once.
- ``rope_forward(x (B, H, L, Dh), cos, sin, interleaved, out=None, positions=None)`` and ``rope_backward``
  (-sin); cos/sin (L, F) or (B, L, F), or (P, F) read at ``positions`` (L,) / (1, L) / (B, L),
  float32/float64; ``out=x`` rotates in place.
- ``rope_qk(q, k, cos, sin, interleaved, *, out_q=None, out_k=None, positions=None) -> (q', k')`` in one
  launch, and ``rope_qk_backward``.
- Vocab-parallel cross-entropy (:mod:`.cross_entropy`), logits (N, Vs) of one vocab shard:
  ``cross_entropy_stats(logits, targets, vocab_start=0) -> (N, 3)``, ``combine_cross_entropy_stats(
  stats (W, N, 3), targets, ignore_index=-100) -> (loss, lse)``, ``cross_entropy_backward(logits,
  targets, lse, grad_loss, vocab_start=0, ignore_index=-100, *, inplace=False)`` and the unsharded
  ``cross_entropy(logits, targets, ignore_index=-100) -> (loss, lse)``.
- Tied loss (:mod:`.tied_loss`): ``tied_loss_block(z (c, Vl), t (c,), *, coef=None, lse=None, eps=0.0,
  vocab_size=None, softcap=None) -> stats (c, 4)``, one block of logits turned into its log-sum-exp
  statistics and gradient in place (CUDA only: the CPU runs plain torch ops; NumPy twin
  ``kernels.reference.tied_loss_block_ref``).

Every launch passes ``enable_fp_fusion=False``: products and sums round separately, as in the NumPy
references, so forwards match them bit for bit on any backend.
"""

from __future__ import annotations

from tokenpos.kernels.triton.cross_entropy import (
    combine_cross_entropy_stats,
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_stats,
)
from tokenpos.kernels.triton.embedding import embedding_backward, embedding_forward
from tokenpos.kernels.triton.rope import rope_backward, rope_forward, rope_qk, rope_qk_backward
from tokenpos.kernels.triton.tied_loss import tied_loss_block

__all__ = [
    "combine_cross_entropy_stats",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_stats",
    "embedding_backward",
    "embedding_forward",
    "rope_backward",
    "rope_forward",
    "rope_qk",
    "rope_qk_backward",
    "tied_loss_block",
]
