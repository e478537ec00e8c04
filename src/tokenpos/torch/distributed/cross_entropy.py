"""Cross-entropy over vocab-parallel logits, without ever gathering the (..., V) logits.

Shapes: N tokens (targets (...) flattened), Vl local columns per rank, V vocab (unpadded), W world size.
Rank r holds the logits of columns [r * Vl, (r + 1) * Vl) (``VocabParallelEmbedding.attend``'s output);
columns >= V are padding and never count.

In the compute dtype c (float32, or float64 for float64 logits), per token n:

    m   = max over all ranks of x[n, :]               all-reduce 1 (max)
    s   = sum over all ranks of exp(x[n, :] - m)      all-reduce 2 (sum)
    x_t = x[n, t_n] (from its owner; 0 elsewhere)     all-reduce 3 (sum; with label smoothing it carries
                                                      sum_c x[n, c] in the same call)
    loss_n = (1 - eps) * (log s + m - x_t) + eps * (log s + m - sum_c x[n, c] / V)

which is ``F.cross_entropy(full_logits, t, label_smoothing=eps)``. Backward needs no collective:
``d loss_n / d x[n, c] = softmax[n, c] - (1 - eps) * [c == t_n] - eps / V`` on the real columns.

Without ``vocab_size=`` a padding column is one whose logit is -inf (``attend`` writes -inf there). A target
whose logit is -inf raises a TokenIdError on every rank after all-reduce 3, instead of an infinite loss; with label
smoothing, all-reduce 3 also carries each row's count of columns that are not -inf, and a padded row refuses the
call with a ConfigError naming ``vocab_size=`` (API.md), so a shard that is not padded never refuses (every column
is then a class: V = W * Vl). CPU: the values are read, at no cost; elsewhere one device-side assert each, no host sync.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tokenpos._config import device_checks_enabled
from tokenpos.tables.checks.tied_loss import (
    REDUCTIONS,
    padded_target_device_message,
    padded_target_message,
    smoothing_needs_vocab_size_message,
    target_dtype_message,
)
from tokenpos.tables.checks.validation import check_choice, check_float, check_int, dtype_name
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.torch._checks import _INT_DTYPES, check_target_values, is_wrapped, values_readable
from tokenpos.torch.distributed._comm import all_reduce, resolve_group


def check_targets(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """Integer targets, each in [0, V) or equal to ``ignore_index``. The same targets on every rank
    make every rank raise together, before any collective.

    On the CPU the values are read (a TokenIdError naming the first bad target); on another device
    (unless ``tokenpos.set_device_checks(True)``) one device-side assert, with no host sync (see
    ``tokenpos.torch._checks``).

    Raises:
        TokenIdError: a non-integer dtype, or a value out of range that is not ``ignore_index`` (CPU).
    """
    if targets.dtype not in _INT_DTYPES:
        raise TokenIdError(target_dtype_message(targets.dtype, vocab_size, ignore_index))
    check_target_values(targets, vocab_size, ignore_index)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """local logits (..., Vl), targets (...) -> loss () or (...) in the compute dtype."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, group: Any, world: int, start: int,
                vocab_size: int | None, ignore_index: int, eps: float, reduction: str) -> torch.Tensor:
        Vl = logits.shape[-1]
        c = torch.promote_types(logits.dtype, torch.float32)
        x = logits.reshape(-1, Vl).to(c)                                       # (N, Vl)
        t = targets.reshape(-1).to(x.device).long()                            # (N,)
        V = world * Vl if vocab_size is None else vocab_size                   # classes (None: every column)
        n_real = min(max(V - start, 0), Vl)                                    # real columns here
        real = (torch.arange(Vl, device=x.device) < n_real).unsqueeze(0)       # (1, Vl)
        if n_real < Vl:
            x = x.masked_fill(~real, float("-inf"))
        m = x.amax(dim=-1)                                                     # (N,)
        if world > 1:
            all_reduce(m, group, dist.ReduceOp.MAX)
        e = torch.exp(x - m.unsqueeze(-1))                                     # (N, Vl)
        s = e.sum(dim=-1)                                                      # (N,)
        if world > 1:
            all_reduce(s, group)
        valid = t != ignore_index                                              # (N,)
        local_t = t - start
        here = valid & (local_t >= 0) & (local_t < Vl)                         # (N,) target on this rank
        idx = torch.where(here, local_t, torch.zeros_like(local_t))
        parts = [torch.where(here, x.gather(1, idx.unsqueeze(1)).squeeze(1), torch.zeros_like(m))]
        if eps > 0.0:
            parts.append(torch.where(real, x, torch.zeros_like(x)).sum(dim=-1))
            if vocab_size is None:
                parts.append((x != float("-inf")).sum(dim=-1).to(c))           # for the refusal: no -inf column
        reduced = torch.stack(parts)                                           # (1 to 3, N)
        if world > 1:
            all_reduce(reduced, group)
        if vocab_size is None:                         # every rank holds the same sums: every rank raises
            _check_padded_targets(valid & (reduced[0] == float("-inf")), targets, ignore_index, world * Vl)
            if eps > 0.0:
                _check_smoothing_columns(reduced[2] < world * Vl, eps, world * Vl)
        lse = torch.log(s) + m                                                 # (N,)
        per = lse - reduced[0]
        smooth = None                                                          # (1, Vl): eps / V on real columns
        if eps > 0.0:
            per = (1.0 - eps) * per + eps * (lse - reduced[1] / V)
            smooth = real.to(c) * (eps / V)
        per = torch.where(valid, per, torch.zeros_like(per))
        count = valid.sum().clamp_min(1)                                       # () on the device: never read
        ctx.save_for_backward(e / s.unsqueeze(-1), idx, here, valid, count, smooth)
        ctx.args = (logits.shape, logits.dtype, eps, reduction)
        if reduction == "mean":
            return per.sum() / count
        if reduction == "sum":
            return per.sum()
        return per.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        probs, idx, here, valid, count, smooth = ctx.saved_tensors
        shape, dtype, eps, reduction = ctx.args
        g = probs.clone()                                                      # (N, Vl)
        # - (1 - eps) at each row's target column when the target is on this rank (x + -a == x - a)
        g.scatter_add_(1, idx.unsqueeze(1), here.to(g.dtype).unsqueeze(1) * -(1.0 - eps))
        if smooth is not None:
            g -= smooth
        g = torch.where(valid.unsqueeze(-1), g, torch.zeros_like(g))
        if reduction == "none":
            g = g * grad.reshape(-1, 1).to(g.dtype)
        else:
            g = g * (grad.to(g.dtype) / count if reduction == "mean" else grad.to(g.dtype))
        return g.reshape(shape).to(dtype), None, None, None, None, None, None, None, None


def _check_padded_targets(bad: torch.Tensor, targets: torch.Tensor, ignore_index: int, columns: int) -> None:
    """No target in a padding (-inf) column: bad (N,) from the all-reduced target logits, the same on every rank.
    Read on the CPU (a TokenIdError naming the first); one device-side assert elsewhere (no host sync), or read
    with ``tokenpos.set_device_checks(True)``; tensors wrapped by ``torch.func`` are not checked (as
    ``check_target_values``)."""
    if bad.numel() == 0 or bad.is_meta:
        return
    if not bad.is_cpu and not (device_checks_enabled() and values_readable(bad)):
        if not is_wrapped(bad):
            torch._assert_async(~bad.any(), padded_target_device_message(ignore_index, bad.device))
        return
    if values_readable(bad) and bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), tuple(targets.shape)))
        raise TokenIdError(padded_target_message(int(targets.reshape(-1)[first]), index, ignore_index, columns))


def _check_smoothing_columns(padded: torch.Tensor, eps: float, columns: int) -> None:
    """Label smoothing without ``vocab_size=`` over logits with padding (-inf) columns is refused (API.md: the
    smoothing spreads over the real vocab, which the caller names): padded (N,) flags the rows with a -inf column,
    from the all-reduced counts, the same on every rank, so every rank raises. A shard that is not padded is never
    refused. CPU: a ConfigError; elsewhere one device-side assert (no host sync)."""
    if padded.numel() == 0 or padded.is_meta:
        return
    if not padded.is_cpu and not (device_checks_enabled() and values_readable(padded)):
        if not is_wrapped(padded):
            torch._assert_async(~padded.any(), smoothing_needs_vocab_size_message(eps, columns))
        return
    if values_readable(padded) and bool(padded.any()):
        raise ConfigError(smoothing_needs_vocab_size_message(eps, columns))


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: Any, *, group: Any = None,
                                 ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                                 vocab_size: int | None = None) -> torch.Tensor:
    """``F.cross_entropy`` of the full logits, from this rank's columns: (..., Vl), (...) -> () or (...).

    Args:
        local_logits: this rank's columns, e.g. ``VocabParallelEmbedding.attend(h)``; any float dtype
            (computed in float32, float64 stays float64; the loss is returned in that compute dtype).
        targets: (...) integer ids, the same on every rank.
        group: the embedding's process group (None: the default world).
        ignore_index: targets equal to it count nowhere (not in the mean's denominator either).
        label_smoothing: eps in [0, 1], spread over the V real classes as ``F.cross_entropy`` does.
        reduction: "mean" (over non-ignored targets), "sum" or "none" (a (...) loss, 0 where ignored).
        vocab_size: the real vocab V when the columns are padded (pass the embedding's ``vocab_size``;
            columns >= V are excluded, and targets are checked against it before any collective). None: every
            column is a class, except that a target in a -inf column (``attend``'s padding) raises, and label
            smoothing over logits with -inf columns is refused (it spreads over the real vocab: pass it).

    When every target is ignored the loss is 0 and the gradient zero (``F.cross_entropy`` gives NaN).
    Three all-reduces in forward (none at W = 1), none in backward.

    No call reads a device value on the host: on CUDA the loss, its mean and its gradient stay on the
    device (a bad target fails a device-side assert there, see ``check_targets``).

    Raises:
        TokenIdError: a target outside [0, V) that is not ``ignore_index`` (CPU), on every rank, before any
            collective; without ``vocab_size``, a target in a padding (-inf) column, on every rank after the
            third all-reduce (CPU; a device-side assert elsewhere, with no host sync).
        ConfigError: shapes that do not match, a bad option, or label_smoothing > 0 without vocab_size over
            logits with padding (-inf) columns (a shard that is not padded is never refused).
    """
    g, rank, world = resolve_group(group)
    if not isinstance(local_logits, torch.Tensor) or not local_logits.is_floating_point():
        raise ConfigError(f"local_logits must be a float tensor, got {type(local_logits).__name__}"
                          + (f" of dtype {dtype_name(local_logits.dtype)}" if isinstance(local_logits, torch.Tensor)
                             else ""))
    if local_logits.ndim < 1 or local_logits.shape[-1] < 1:
        raise ConfigError(f"local_logits must have shape (..., Vl) with Vl >= 1, got {tuple(local_logits.shape)}")
    t = torch.as_tensor(targets, device=local_logits.device)
    if tuple(t.shape) != tuple(local_logits.shape[:-1]):
        raise ConfigError(f"targets must have shape {tuple(local_logits.shape[:-1])} (the logits' without the "
                          f"last axis), got {tuple(t.shape)}")
    Vl = int(local_logits.shape[-1])
    V = world * Vl if vocab_size is None else check_int("vocab_size", vocab_size, minimum=1)
    if V > world * Vl:
        raise ConfigError(f"vocab_size must be <= world_size * local columns = {world * Vl}, got {V}")
    ignore_index = check_int("ignore_index", ignore_index)
    eps = check_float("label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_choice("reduction", reduction, REDUCTIONS)
    check_targets(t, V, ignore_index)
    return _VocabParallelCrossEntropy.apply(local_logits, t, g, world, rank * Vl, None if vocab_size is None else V,
                                            ignore_index, eps, reduction)
