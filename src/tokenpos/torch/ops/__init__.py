"""tokenpos's torch custom ops (``torch.ops.tokenpos.*``), registered with ``torch.library`` on import.

- ``tokenpos::embedding`` / ``tokenpos::embedding_backward`` (:mod:`.embedding`)
- ``tokenpos::rope`` / ``tokenpos::rope_qk`` and their transposes ``tokenpos::rope_backward`` /
  ``tokenpos::rope_qk_backward`` (:mod:`.rope`)
- ``tokenpos::ngram_embedding`` / ``tokenpos::ngram_embedding_backward`` (:mod:`.ngram`): the hashed n-gram
  lookup (Engram), hash and gather in one pass
- ``tokenpos::quantized_embedding`` (:mod:`.quantized`): an 8-bit table's gather, dequantised in the same pass
  (int8 or float8 e4m3fn bits, a scale per row); inference only (no autograd: the table is frozen)
- ``tokenpos::tied_cross_entropy`` / ``tokenpos::tied_cross_entropy_backward`` (:mod:`.tied_loss`): the tied
  output projection and its cross-entropy, chunked torch matmuls on every device (:mod:`.tied_loss_blocks`;
  first order only, :mod:`.first_order`)

Each has a CPU implementation (the numba kernel for float32 / float64), a plain-torch one for every
other device and dtype, a fake (meta) implementation, registered autograd (double backward
included, but for the tied loss) and a vmap rule. Which kernel runs is decided in :mod:`._dispatch` alone; every
implementation first runs the op's one argument check (``tokenpos.tables.checks.ops``).

Layers call :func:`embed` / :func:`rotate` / :func:`rotate_qk` (:mod:`.entry`): the op under
``torch.compile``, the op's implementation directly in eager mode (its backward is the backward op),
and the same formula in plain torch ops under ``torch.func`` transforms.
:func:`samples` yields ``(op, args, kwargs)`` triples covering every op, for
``torch.library.opcheck``.
"""

from tokenpos.torch.ops.embedding import embedding, embedding_backward
from tokenpos.torch.ops.entry import embed, rotate, rotate_qk
from tokenpos.torch.ops.ngram import ngram_embedding, ngram_embedding_backward
from tokenpos.torch.ops.rope import rope, rope_qk
from tokenpos.torch.ops.samples import samples
from tokenpos.torch.ops.tied_loss import tied_cross_entropy, tied_cross_entropy_backward

__all__ = ["embed", "embedding", "embedding_backward", "ngram_embedding", "ngram_embedding_backward", "rope",
           "rope_qk", "rotate", "rotate_qk", "samples", "tied_cross_entropy", "tied_cross_entropy_backward"]
