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

A shard (``row_start``, both ops; the vocab-parallel layer's part of the lookup): weight (Rw, Dh) holds the
table's rows [row_start, row_start + Rw), and

    out[..., h*Dh:(h+1)*Dh] = weight[rows[..., h] - row_start]   if row_start <= rows[..., h] < row_start + Rw
                              0                                   otherwise

summed over the shards of a table, the whole lookup. The kernel writes the zeros without reading the table, so
a shard's lookup reads only its rows; the backward op then gives the shard's (Rw, Dh) gradient.

The layers reach the forward op through :func:`ngram_lookup` (the implementation, without the dispatcher, in
eager mode), as the token embedding's ``ops.entry.embed``.
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


def fused_on(weight: torch.Tensor) -> bool:
    """Whether a lookup in ``weight`` runs the fused numba kernel (CPU float32 / float64, kernels on, no
    ``torch.func`` transform): where a shard's lookup (``row_start``) hashes and gathers in one pass, reading only
    the shard's rows."""
    return _numba(weight)


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


def forward_impl(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                 context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor,
                 offsets: torch.Tensor, pad: int, row_start: int | None = None) -> torch.Tensor:
    """The implementation of ``tokenpos::ngram_embedding``, on arguments of valid shapes and dtypes (the op checks
    them first; the layers, which call it directly through :func:`ngram_lookup`, build them from checked inputs):
    the numba kernel writing into a fresh :func:`cpu_empty` output on the CPU, else :func:`formula`."""
    if _numba(weight):
        out, out_np = cpu_empty((*ids.shape, primes.shape[0] * weight.shape[1]), weight.dtype)
        kernel.ngram_forward(np.ascontiguousarray(np_view(weight)), _np(ids), _np(compress),  # type: ignore[arg-type]
                             _np(multipliers), _np(primes), _np(offsets), pad, out_np,  # type: ignore[arg-type]
                             cu_seqlens=_np(cu_seqlens), context=_np(context), row_start=row_start or 0)
        return out
    return formula(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start)


@torch.library.custom_op("tokenpos::ngram_embedding", mutates_args=())
def ngram_embedding(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                    context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                    primes: torch.Tensor, offsets: torch.Tensor, pad: int,
                    row_start: int | None = None) -> torch.Tensor:
    """weight (R, Dh), ids (B, L) / (T,) -> (..., K * Dh): the hashed rows of every token. ``row_start`` given:
    weight (Rw, Dh) is a shard holding the table's rows [row_start, row_start + Rw), and the other rows' slices
    are zeros. See the module doc."""
    _check(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    return forward_impl(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start)


def formula(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
            compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
            pad: int, row_start: int | None = None) -> torch.Tensor:
    """The op's value in plain torch ops, differentiable by autograd and by ``torch.func`` (the layer's route
    under a transform, where the op's registered autograd cannot go): weight (Rw, Dh), ids (B, L) / (T,) ->
    (..., K * Dh). ``row_start`` given (a shard (Rw, Dh)): rows outside [row_start, row_start + Rw) give zeros."""
    rows = table_rows(ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad)      # (..., K)
    if row_start is not None:
        rows, owned = _local_rows(rows, row_start, weight.shape[0])
        out = torch.where(owned.unsqueeze(-1), weight[rows], weight.new_zeros(()))                # (..., K, Dh)
    else:
        out = weight[rows]
    return out.reshape(*ids.shape, primes.shape[0] * weight.shape[1])


def _local_rows(rows: torch.Tensor, row_start: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rows of the whole table -> (rows of the shard [row_start, row_start + num_rows), clamped into it so that
    every one can be read, and the mask of those it owns)."""
    local = rows - row_start
    owned = (local >= 0) & (local < num_rows)
    return local.clamp(0, max(num_rows - 1, 0)), owned


@ngram_embedding.register_fake
def _(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
      compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
      pad: int, row_start: int | None = None) -> torch.Tensor:
    _check(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    return weight.new_empty((*ids.shape, primes.shape[0] * weight.shape[1]))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start = inputs
    ctx.save_for_backward(ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    ctx.num_rows, ctx.pad, ctx.row_start = weight.shape[0], pad, row_start


def _grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    if not ctx.needs_input_grad[0]:
        return (None,) * 10
    ids, cu_seqlens, context, compress, multipliers, primes, offsets = ctx.saved_tensors
    gw = torch.ops.tokenpos.ngram_embedding_backward(grad, ids, cu_seqlens, context, compress, multipliers, primes,
                                                     offsets, ctx.pad, ctx.num_rows, ctx.row_start)
    return (gw,) + (None,) * 9


ngram_embedding.register_autograd(_grad, setup_context=_setup)


class _NgramEmbedding(torch.autograd.Function):
    """The op's eager autograd without the custom-op dispatcher (:func:`ngram_lookup`): forward the
    implementation, backward the backward *op* (so double backward is the forward op again, as with the op)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor,
                offsets: torch.Tensor, pad: int, row_start: int | None) -> Any:
        _setup(ctx, (weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start), None)
        return forward_impl(weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _grad(ctx, grad)


def ngram_lookup(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                 context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                 primes: torch.Tensor, offsets: torch.Tensor, pad: int, row_start: int | None = None) -> torch.Tensor:
    """``tokenpos::ngram_embedding`` as the layers call it (arguments built from checked inputs), reached the
    cheapest way that keeps the op's semantics, as ``ops.entry.embed`` reaches the token embedding: the op itself
    under ``torch.compile`` tracing (the graph keeps it); :func:`formula` under ``torch.func`` transforms (a custom
    op's autograd cannot run at a transform's grad level); else the implementation called directly, through
    :class:`_NgramEmbedding` when the table needs a gradient. The dispatcher's Python per call (argument binding
    and defaults, its autograd wrapper, the op's checks: about 40 us of a 50 us small call on the 2-core guest,
    more with cold caches after a large kernel) is skipped. weight (Rw, Dh), ids (B, L) / (T,) -> (..., K * Dh)."""
    args = (weight, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, row_start)
    if torch.compiler.is_compiling():
        return torch.ops.tokenpos.ngram_embedding(*args)  # type: ignore[no-any-return]
    if transforms_active():
        return formula(*args)
    if torch.is_grad_enabled() and weight.requires_grad:
        return _NgramEmbedding.apply(*args)  # type: ignore[no-any-return]
    return forward_impl(*args)


class _NgramSparse(_NgramEmbedding):
    """A lookup by the fused kernel whose weight gradient is row-sparse (:func:`ngram_lookup_sparse`): the forward
    of :class:`_NgramEmbedding`, a backward of its own."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        ids, cu_seqlens, context, compress, multipliers, primes, offsets = ctx.saved_tensors
        uniq, summed = kernel.ngram_backward(np.ascontiguousarray(np_view(grad)), _np(ids), _np(compress),  # type: ignore[arg-type]
                                             _np(multipliers), _np(primes), _np(offsets), ctx.pad,  # type: ignore[arg-type]
                                             cu_seqlens=_np(cu_seqlens), context=_np(context),
                                             row_start=ctx.row_start or 0, num_rows=ctx.num_rows)
        gw = torch.sparse_coo_tensor(torch.from_numpy(uniq)[None], torch.from_numpy(summed),
                                     (ctx.num_rows, summed.shape[1]), is_coalesced=True,
                                     check_invariants=False)   # sorted unique rows in range, by construction
        return (gw,) + (None,) * 9


def ngram_lookup_sparse(weight: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                        context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                        primes: torch.Tensor, offsets: torch.Tensor, pad: int,
                        row_start: int | None = None) -> torch.Tensor:
    """:func:`ngram_lookup`'s value (eager, :func:`fused_on` tables only) with a row-sparse weight gradient, as
    ``F.embedding(sparse=True)`` gives: a coalesced ``torch.sparse_coo`` (Rw, Dh) tensor of the looked-up rows (of
    the shard at ``row_start``), each the float64 sum of its slices (the kernel's backward, with the shard's range:
    no (..., K) rows tensor, and a rank sums only its own rows). weight (Rw, Dh), ids (B, L) / (T,) ->
    (..., K * Dh)."""
    return _NgramSparse.apply(weight, ids, cu_seqlens, context, compress, multipliers,  # type: ignore[no-any-return]
                              primes, offsets, pad, row_start)


@torch.library.custom_op("tokenpos::ngram_embedding_backward", mutates_args=())
def ngram_embedding_backward(grad: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
                             context: torch.Tensor | None, compress: torch.Tensor, multipliers: torch.Tensor,
                             primes: torch.Tensor, offsets: torch.Tensor, pad: int, num_rows: int,
                             row_start: int | None = None) -> torch.Tensor:
    """grad (..., K * Dh) -> the dense (R, Dh) weight gradient, R = num_rows; ``row_start`` given: the
    (num_rows, Dh) gradient of the shard holding the table's rows [row_start, row_start + num_rows)."""
    K = primes.shape[0]
    Dh = grad.shape[-1] // K
    _check(grad.new_empty((num_rows, Dh)), ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    if grad.shape != (*ids.shape, K * Dh):
        raise ConfigError(shape_message("grad", (*ids.shape, K * Dh), grad.shape))
    if _numba(grad):
        uniq, summed = kernel.ngram_backward(np.ascontiguousarray(np_view(grad)), _np(ids), _np(compress),  # type: ignore[arg-type]
                                             _np(multipliers), _np(primes), _np(offsets), pad,  # type: ignore[arg-type]
                                             cu_seqlens=_np(cu_seqlens), context=_np(context),
                                             row_start=row_start or 0, num_rows=num_rows)
        gw = torch.zeros(num_rows, Dh, dtype=grad.dtype)
        gw.index_copy_(0, torch.from_numpy(uniq), torch.from_numpy(summed))
        return gw
    rows = table_rows(ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad).reshape(-1)
    ct = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    gw = torch.zeros(num_rows, Dh, dtype=ct, device=grad.device)
    g = grad.reshape(-1, Dh).to(ct)
    if row_start is not None:                         # a shard: its rows' slices (a zero row index for the others)
        rows, owned = _local_rows(rows, row_start, num_rows)
        g = torch.where(owned.unsqueeze(-1), g, g.new_zeros(()))
    gw.index_add_(0, rows, g)
    return gw.to(grad.dtype)


@ngram_embedding_backward.register_fake
def _(grad: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor | None, context: torch.Tensor | None,
      compress: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor, pad: int,
      num_rows: int, row_start: int | None = None) -> torch.Tensor:
    return grad.new_empty((num_rows, grad.shape[-1] // primes.shape[0]))


def _backward_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ids, cu_seqlens, context, compress, multipliers, primes, offsets, pad, _, row_start = inputs
    ctx.save_for_backward(ids, cu_seqlens, context, compress, multipliers, primes, offsets)
    ctx.pad, ctx.row_start = pad, row_start


def _backward_grad(ctx: Any, gg: torch.Tensor) -> tuple[Any, ...]:
    """The adjoint of the (linear) backward: the forward op on the incoming gradient."""
    ids, cu_seqlens, context, compress, multipliers, primes, offsets = ctx.saved_tensors
    out = torch.ops.tokenpos.ngram_embedding(gg, ids, cu_seqlens, context, compress, multipliers, primes, offsets,
                                             ctx.pad, ctx.row_start)
    return (out,) + (None,) * 10


ngram_embedding_backward.register_autograd(_backward_grad, setup_context=_backward_setup)


def ngram_samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(op, args, kwargs) for ``opcheck``: float32 without grad and float64 with grad, (B, L) ids, packed ids with
    cu_seqlens (an empty document too), a context, int32 ids, a strided table, a shard of the table (``row_start``);
    max_ngram_size 2 and 3."""
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
            shard = spec.num_rows // 3                                       # rows [shard, 2 * shard) of the table
            yield ngram_embedding, (table(rows=shard), ids, None, None, *tables, spec.pad, shard), {}
            if not grad:
                g = torch.randn(2, 5, spec.out_dim, generator=gen, dtype=dtype).to(device)
                yield ngram_embedding_backward, (g, ids, None, ctx[:2], *tables, spec.pad, spec.num_rows), {}
                yield ngram_embedding_backward, (g, ids, None, None, *tables, spec.pad, shard, shard), {}
