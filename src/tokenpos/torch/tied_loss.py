"""``tied_cross_entropy``: the checked public entry of the torch tied loss (h (..., D), weight (V, D), targets (...)).

It checks the inputs once and runs the custom op ``torch.ops.tokenpos.tied_cross_entropy`` (chunked over
tokens, never the (N, V) logits; its backward is ``tokenpos::tied_cross_entropy_backward``): the op itself
under ``torch.compile`` and ``torch.func``, its implementation through ``ops.tied_loss.TiedLoss`` in eager mode
(as ``ops/entry.py`` does for the other ops; that backward scales the forward's gradients in place).
``torch.func`` transforms are refused (a ConfigError): the blocks are written with ``out=``.
``TokenEmbedding.loss`` calls it with the layer's table.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.tied_loss import check_options
from tokenpos.tables.errors import ConfigError
from tokenpos.torch._checks import check_float_tensor, check_target_values, is_compiling, transforms_active
from tokenpos.torch.ops.tied_loss import TiedLoss, check_tensors


def tied_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: Any, *, ignore_index: int = -100,
                       label_smoothing: float = 0.0, reduction: str = "mean", softcap: float | None = None,
                       chunk_size: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(cap(h @ weight.T), targets, ...)`` without the logits: h (..., D), weight (V, D),
    targets (...) -> loss () ("mean", "sum") or (...) ("none"), in float32 (fp16 / bf16 / fp32) or float64,
    with gradients for h and weight.

    ``softcap``: logits become ``softcap * tanh(z / softcap)`` first (Gemma 2). ``chunk_size``: tokens per
    block of logits (default: a float32 block of at most 64 MiB). "mean" averages over the non-ignored
    targets; all ignored gives loss 0 and gradient 0 (``F.cross_entropy`` gives NaN).

    Raises:
        TokenIdError: a target outside [0, V) that is not ``ignore_index`` (CPU; a device-side assert on
            another device), or non-integer targets.
        DtypeError: h or weight not float, or of two dtypes. ConfigError: two devices, shapes that do not
            fit, a bad option.
    """
    check_float_tensor("h", h)
    check_float_tensor("weight", weight)
    t = targets if isinstance(targets, torch.Tensor) else torch.as_tensor(targets, device=weight.device)
    # a scalar loss that needs gradients gets them from the forward's own blocks (no recomputed logits); not in
    # fp16, whose loss is scaled (GradScaler): gradients kept at d loss = 1 would be rounded to fp16 before the
    # scale (small ones flushed to 0) and a scale of 2**16 is inf in fp16, so its backward recomputes them, scaled
    with_grad = (torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad) and reduction != "none"
                 and h.dtype != torch.float16)
    if is_compiling():       # the constants are checked by the op's fake while tracing, the values by the op
        return torch.ops.tokenpos.tied_cross_entropy(h, weight, t, ignore_index, label_smoothing, reduction, softcap,
                                                     chunk_size, with_grad)[0]
    opts = check_options(ignore_index, label_smoothing, reduction, softcap, chunk_size)
    check_tensors(h, weight, t, weight.shape[0], opts[0])
    check_target_values(t, weight.shape[0], opts[0])
    if transforms_active():  # its blocks are written with out= (no autograd through them) and it has no vmap rule
        raise ConfigError("tied_cross_entropy does not run under torch.func transforms (grad, vmap, ...); call it "
                          "outside the transform, or use F.cross_entropy(h @ weight.T, targets) there")
    return TiedLoss.apply(h, weight, t, *opts, with_grad)         # eager: the op's implementation, no dispatcher
