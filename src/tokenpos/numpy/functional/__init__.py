"""tokenpos.numpy.functional: every computation of the NumPy layers as a pure forward/backward pair.

cs231n style: ``forward(inputs, *, settings) -> (out, cache)`` and ``backward(dout, cache) -> grads``.
Nothing is kept between calls except what the caller keeps (layers keep the last cache as
``self._cache``); inputs a cache needs are copied (``_dispatch.kept``), so a caller refilling its
buffers cannot change a later backward. The choice between a fused numba kernel and plain NumPy is
made in one place, ``_dispatch.use_kernel`` (kernels on, float32/float64).

Shape legend: B batch, L length, D d_model, V vocab, P table rows, H heads, Dh head dim, R rotary dim.
"""

from tokenpos.numpy.functional._dispatch import compute_dtype, use_kernel
from tokenpos.numpy.functional.attend import AttendCache, attend_backward, attend_forward
from tokenpos.numpy.functional.dropout import DropoutCache, dropout_backward, dropout_forward, dropout_multiplier
from tokenpos.numpy.functional.embedding import EmbeddingCache, embedding_backward, embedding_forward
from tokenpos.numpy.functional.norm import (
    NormCache,
    layernorm_backward,
    layernorm_forward,
    rmsnorm_backward,
    rmsnorm_forward,
)
from tokenpos.numpy.functional.rope import RopeCache, rope_backward, rope_forward, rope_qk_backward, rope_qk_forward
from tokenpos.numpy.functional.tied_loss import (
    TiedLossCache,
    check_tied_loss_args,
    loss_grad,
    tied_cross_entropy_backward,
    tied_cross_entropy_forward,
)

__all__ = [
    "AttendCache",
    "attend_backward",
    "attend_forward",
    "DropoutCache",
    "EmbeddingCache",
    "NormCache",
    "RopeCache",
    "compute_dtype",
    "dropout_backward",
    "dropout_forward",
    "dropout_multiplier",
    "embedding_backward",
    "embedding_forward",
    "layernorm_backward",
    "layernorm_forward",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "rope_backward",
    "rope_forward",
    "rope_qk_backward",
    "rope_qk_forward",
    "use_kernel",
    "TiedLossCache",
    "check_tied_loss_args",
    "loss_grad",
    "tied_cross_entropy_backward",
    "tied_cross_entropy_forward",
]
