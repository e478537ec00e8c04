"""``tokenpos::ngram_embedding`` and ``tokenpos::ngram_embedding_backward``: the hashed n-gram lookup as torch ops.

Shapes: ids (B, L), or packed (T,) with ``cu_seqlens`` (S + 1,); ``context`` (S, C) raw ids before each sequence
(C <= n_max - 1; None: none); weight (R, Dh); compress (Vo,), multipliers (n_max,), primes and offsets (K,), all
int64 on weight's device; out (..., K * Dh).

    rows = offsets + ngram_hash_ids(compress[ids])        (tables.formulas.ngram_hash, bit for bit)
    out  = weight[rows].flatten(-2)

On the CPU (float32 / float64, kernels on) the numba kernel (:mod:`tokenpos.kernels.ngram`) hashes and gathers
in one pass; elsewhere the same hashing in int64 torch ops and a gather. The backward op returns the dense
(R, Dh) weight gradient (a scatter-add of the gradient slices onto their rows); it is linear in ``grad``, and its
registered backward is the forward op again. Ids are checked by the layer (``torch.ngram``); the kernel keeps its
memory bound and raises ``KernelBoundError`` for a bad id it meets anyway.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tokenpos._config import kernels_enabled
from tokenpos.kernels import ngram as kernel
from tokenpos.tables.checks.validation import shape_message
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.ngram_hash import ngram_spec
from tokenpos.torch._checks import transforms_active
from tokenpos.torch.ops._dispatch import cpu_empty, cpu_path, np_view


def _check(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
           compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor) -> None:
    """Shapes and dtypes (never values): the op's one argument check."""
    if weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ConfigError(f"weight must be a 2-D float table (R, Dh), got {weight.dtype} {tuple(weight.shape)}")
    if ids.dtype not in (torch.int32, torch.int64) or ids.dim() not in (1, 2):
        raise ConfigError(f"ids must be int32 / int64 of shape (B, L) or (T,), got {ids.dtype} {tuple(ids.shape)}")
    if cu_seqlens is not None and (ids.dim() != 1 or cu_seqlens.dim() != 1):
        raise ConfigError("cu_seqlens (S + 1,) goes with packed (T,) ids")
    for name, t in (("compress", compress), ("multipliers", multipliers), ("primes", primes), ("offsets", offsets)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ConfigError(f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    if multipliers.shape[0] < 2 or primes.shape[0] % (multipliers.shape[0] - 1) or offsets.shape != primes.shape:
        raise ConfigError(f"primes and offsets must hold (max_ngram_size - 1) * heads entries, got "
                          f"{tuple(primes.shape)} / {tuple(offsets.shape)} for {multipliers.shape[0]} multipliers")
    if context is not None and (context.dim() != 2 or context.shape[1] >= multipliers.shape[0]
                                or context.dtype not in (torch.int32, torch.int64)):
        raise ConfigError(f"context must be int32 / int64 (S, C) with C < max_ngram_size, got {context.dtype} "
                          f"{tuple(context.shape)}")


def _numba(t: torch.Tensor) -> bool:
    return t.is_cpu and not transforms_active() and cpu_path(t) == "numba"


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else np.ascontiguousarray(np_view(t), dtype=np.int64)


def table_rows(ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
               compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
               pad: int) -> torch.Tensor:
    """(..., K) int64 table rows in plain torch ops (any device; the formula of ``tables.formulas.ngram_hash``)."""
    dev = ids.device
    flat = ids.reshape(-1).long()                                             # (T,)
    T = flat.shape[0]
    if cu_seqlens is None:
        L = ids.shape[-1] if ids.dim() == 2 else T
        docs = ids.shape[0] if ids.dim() == 2 else 1
        cu = torch.arange(docs + 1, device=dev, dtype=torch.int64) * L
    else:
        cu = cu_seqlens.long()
    n = torch.arange(T, device=dev, dtype=torch.int64)
    seg = torch.searchsorted(cu, n, right=True) - 1                           # (T,) document of each token
    inside = n - cu[seg.clamp(min=0)]
    comp = compress[flat]                                                     # (T,)
    ctx = None if context is None or context.shape[1] == 0 else compress[context.long()]   # (S, C)
    n_max = multipliers.shape[0]
    heads = primes.shape[0] // (n_max - 1)
    mix = comp * multipliers[0]
    cols = []
    for k in range(1, n_max):
        lag = torch.where(k <= inside, comp[(n - k).clamp(min=0)], torch.full_like(comp, pad))
        if ctx is not None:
            C = ctx.shape[1]
            back = k - inside
            use = (back > 0) & (back <= C)
            lag = torch.where(use, ctx[seg.clamp(min=0), (C - back).clamp(0, C - 1)], lag)
        mix = torch.bitwise_xor(mix, lag * multipliers[k])
        for j in range(heads):
            h = (k - 1) * heads + j
            cols.append(torch.remainder(mix, primes[h]) + offsets[h])
    return torch.stack(cols, dim=-1).reshape(*ids.shape, primes.shape[0])


def hashed_rows(ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
                compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
                pad: int) -> torch.Tensor:
    """(..., K) int64 table rows, as :func:`table_rows`: by the numba kernel on the CPU (kernels on, no
    transform, not traced), else by :func:`table_rows`. A ``sparse=True`` table gathers them with ``F.embedding``."""
    if ids.is_cpu and kernels_enabled() and not transforms_active() and not torch.compiler.is_compiling():
        x, c, m, p, o = (np.ascontiguousarray(np_view(t), dtype=np.int64)
                         for t in (ids, compress, multipliers, primes, offsets))
        return torch.from_numpy(kernel.ngram_rows(x, c, m, p, o, pad, cu_seqlens=_np(cu_seqlens), context=_np(context)))
    return table_rows(ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad)


@torch.library.custom_op("tokenpos::ngram_embedding", mutates_args=())
def ngram_embedding(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                    context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                    primes: torch.Tensor, offsets: torch.Tensor, pad: int) -> torch.Tensor:
    """weight (R, Dh), ids (B, L) / (T,) -> (..., K * Dh): the hashed rows of every token. See the module doc."""
    _check(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    K, Dh = primes.shape[0], weight.shape[1]
    if _numba(weight):
        out, out_np = cpu_empty((*ids.shape, K * Dh), weight.dtype)
        kernel.ngram_forward(np.ascontiguousarray(np_view(weight)), _np(ids), _np(compress),  # type: ignore[arg-type]
                             _np(multipliers), _np(primes), _np(offsets), pad, out_np,  # type: ignore[arg-type]
                             cu_seqlens=_np(cu_seqlens), context=_np(context))
        return out
    return formula(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad)


def formula(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
            compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
            pad: int) -> torch.Tensor:
    """The op's value in plain torch ops, differentiable by autograd and by ``torch.func`` (the layer's route
    under a transform, where the op's registered autograd cannot go): weight (R, Dh), ids (B, L) / (T,) ->
    (..., K * Dh)."""
    rows = table_rows(ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad)
    return weight[rows].reshape(*ids.shape, primes.shape[0] * weight.shape[1])


@ngram_embedding.register_fake
def _(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
      compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
      pad: int) -> torch.Tensor:
    _check(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    return weight.new_empty((*ids.shape, primes.shape[0] * weight.shape[1]))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad = inputs
    ctx.save_for_backward(ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    ctx.num_rows, ctx.pad = weight.shape[0], pad


def _grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    if not ctx.needs_input_grad[0]:
        return (None,) * 9
    ids, cu_seqlens, context, compress, multipliers, primes, offsets = ctx.saved_tensors
    gw = torch.ops.tokenpos.ngram_embedding_backward(grad, ids, cu_seqlens, context, compress, multipliers, primes,
                                                     offsets, ctx.pad, ctx.num_rows)
    return (gw,) + (None,) * 8


ngram_embedding.register_autograd(_grad, setup_context=_setup)


@torch.library.custom_op("tokenpos::ngram_embedding_backward", mutates_args=())
def ngram_embedding_backward(grad: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                             context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                             primes: torch.Tensor, offsets: torch.Tensor, pad: int, num_rows: int) -> torch.Tensor:
    """grad (..., K * Dh) -> the dense (R, Dh) weight gradient, R = num_rows."""
    K = primes.shape[0]
    Dh = grad.shape[-1] // K
    _check(grad.new_empty((num_rows, Dh)), ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    if grad.shape != (*ids.shape, K * Dh):
        raise ConfigError(shape_message("grad", (*ids.shape, K * Dh), grad.shape))
    if _numba(grad):
        uniq, summed = kernel.ngram_backward(np.ascontiguousarray(np_view(grad)), _np(ids), _np(compress),  # type: ignore[arg-type]
                                             _np(multipliers), _np(primes), _np(offsets), pad,  # type: ignore[arg-type]
                                             cu_seqlens=_np(cu_seqlens), context=_np(context))
        gw = torch.zeros(num_rows, Dh, dtype=grad.dtype)
        gw.index_copy_(0, torch.from_numpy(uniq), torch.from_numpy(summed))
        return gw
    rows = table_rows(ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad).reshape(-1)
    ct = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    gw = torch.zeros(num_rows, Dh, dtype=ct, device=grad.device)
    gw.index_add_(0, rows, grad.reshape(-1, Dh).to(ct))
    return gw.to(grad.dtype)


@ngram_embedding_backward.register_fake
def _(grad: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
      compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor, pad: int,
      num_rows: int) -> torch.Tensor:
    return grad.new_empty((num_rows, grad.shape[-1] // primes.shape[0]))


def _backward_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, _ = inputs
    ctx.save_for_backward(ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    ctx.pad = pad


def _backward_grad(ctx: Any, gg: torch.Tensor) -> tuple[Any, ...]:
    """The adjoint of the (linear) backward: the forward op on the incoming gradient."""
    ids, cu_seqlens, context, compress, multipliers, primes, offsets = ctx.saved_tensors
    out = torch.ops.tokenpos.ngram_embedding(gg, ids, cu_seqlens, context, compress, multipliers, primes, offsets,
                                             ctx.pad)
    return (out,) + (None,) * 9


ngram_embedding_backward.register_autograd(_backward_grad, setup_context=_backward_setup)


def ngram_samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(op, args, kwargs) for ``opcheck``: float32 without grad and float64 with grad, (B, L) ids, packed ids with
    cu_seqlens (an empty document too), a context, int32 ids, a strided table; max_ngram_size 2 and 3."""
    gen = torch.Generator().manual_seed(2)
    compress = torch.randint(0, 7, (12,), generator=gen)
    compress[compress.argmax()] = 7                                          # Vc = 8
    for n_max, heads, dim in ((2, 2, 4), (3, 1, 3)):
        spec = ngram_spec(engram_vocab_size=[11] * (n_max - 1), max_ngram_size=n_max, n_embed_per_ngram=dim,
                          n_head_per_ngram=heads, layer_id=1, layer_ids=[1], pad_id=3, seed=0,
                          compress=compress.numpy())
        tables = [torch.from_numpy(np.array(a)).to(device) for a in (spec.compress, spec.multipliers, spec.primes,
                                                                     spec.offsets)]
        for dtype, grad in ((torch.float32, False), (torch.float64, True)):
            def table(wide: bool = False, g: bool = grad, dt: torch.dtype = dtype, rows: int = spec.num_rows,
                      dh: int = spec.head_dim) -> torch.Tensor:
                w = torch.randn(rows, dh * (2 if wide else 1), generator=gen, dtype=dt).to(device)
                return (w[:, ::2] if wide else w).detach().requires_grad_(g)

            ids = torch.randint(0, 12, (2, 5), generator=gen).to(device)
            packed = torch.randint(0, 12, (7,), generator=gen).to(device)
            cu = torch.tensor([0, 3, 3, 7], device=device)
            ctx = torch.randint(0, 12, (3, n_max - 1), generator=gen).to(device)
            yield ngram_embedding, (table(), ids, None, None, *tables, spec.pad), {}
            yield ngram_embedding, (table(True), ids.int(), None, ctx[:2], *tables, spec.pad), {}
            yield ngram_embedding, (table(), packed, cu, ctx, *tables, spec.pad), {}
            if not grad:
                g = torch.randn(2, 5, spec.out_dim, generator=gen, dtype=dtype).to(device)
                yield ngram_embedding_backward, (g, ids, None, ctx[:2], *tables, spec.pad, spec.num_rows), {}
