"""tokenpos's torch custom ops (``torch.ops.tokenpos.*``), registered with ``torch.library`` on import.

- ``tokenpos::embedding`` / ``tokenpos::embedding_backward`` (:mod:`.embedding`)
- ``tokenpos::rope`` / ``tokenpos::rope_qk`` (:mod:`.rope`)

Each has a CPU implementation (the numba kernel for float32 / float64), a plain-torch one for every
other device and dtype, a fake (meta) implementation, registered autograd (double backward
included) and a vmap rule. Which kernel runs is decided in :mod:`._dispatch` alone.

Layers call :func:`embed` / :func:`rotate` / :func:`rotate_qk`: the op, except under ``torch.func``
transforms (grad, jacrev, vmap of grad...), where a custom op's autograd cannot run at the grad
level; there they compute the same formula in plain torch ops (same values, same dropout masks).
:func:`samples` yields ``(op, args, kwargs)`` triples covering every op, for
``torch.library.opcheck``.
"""

from tokenpos.torch.ops.embedding import embed, embedding, embedding_backward
from tokenpos.torch.ops.rope import rope, rope_qk, rotate, rotate_qk
from tokenpos.torch.ops.samples import samples

__all__ = ["embed", "embedding", "embedding_backward", "rope", "rope_qk", "rotate", "rotate_qk", "samples"]
