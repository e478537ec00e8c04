"""``tokenpos::embedding`` and ``tokenpos::embedding_backward``: the fused input block as torch ops.

Shapes: V vocab, D model dim, P positions, ids (...) of any integer dtype; pos the ids' shape or a
trailing part of it ((L,) for ids (B, L)).

    y   = weight[ids] * scale + table[pos]          (the table part only when a table is given)
    out = y * m,  m = 1/(1-p) where keep(seed, i) else 0.0       (counter-hash dropout, p = 0: none)

bf16 / fp16: gathered rows are widened to float32, the whole formula runs in float32, and the
result is rounded once to the weight dtype. ``seed`` is a 0-d int64 tensor (never a Python int, so
``torch.compile`` does not specialise on it). ``padding_idx`` (-1 = none) only matters to the
backward: that row gets no gradient, as in ``F.embedding``.

The backward op returns the dense (V, D) token gradient and the (P, D) table gradient (num_positions
0: an empty (0, D) one). It is linear in ``grad``, and its own registered backward is the forward op
again, so double backward works with the kernels on.
"""

from typing import Any

import torch

from tokenpos.kernels.embedding import bound_error, forward_rows
from tokenpos.kernels.embedding import embedding_backward as kernel_backward
from tokenpos.tables.checks.ops import check_embedding_args, check_embedding_backward_args
from tokenpos.torch._checks import as_index, transforms_active
from tokenpos.torch._dropout import dropout_torch
from tokenpos.torch.ops._dispatch import cpu_empty, cpu_path, np_view, triton_kernels

_LOW = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW else dtype


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------


def _path(weight: torch.Tensor, table: torch.Tensor | None = None) -> str:
    """"numba" (float32 / float64 / bf16 bits), "triton" or "plain" for a call that is not small:
    ``_dispatch``'s choice, plain torch under ``torch.func`` transforms (a tensor's values cannot reach a kernel
    there)."""
    if transforms_active():
        return "plain"
    if weight.is_cuda:
        return "plain" if triton_kernels(*((weight,) if table is None else (weight, table))) is None else "triton"
    return "numba" if weight.is_cpu and cpu_path(weight, table) != "plain" else "plain"


def formula(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None, pos: torch.Tensor | None,
            scale: float, p: float, seed: torch.Tensor | None, padding_idx: int) -> torch.Tensor:
    """The formula in differentiable torch ops, in float32 for fp16 / bf16 (rounded once), the kernel's
    arithmetic in its order (a multiply by 1.0 or an add of nothing is left out: the same bits). torch's gather
    checks every index; an id or position outside its table raises :class:`KernelBoundError` with the shared
    message of the first one (the error path only), as the kernel does."""
    try:
        x = torch.embedding(weight, ids, padding_idx)                                   # (..., D)
        rows = None if table is None or pos is None else torch.embedding(table, pos)    # (..., D) or (L, D)
    except IndexError:
        with torch._C._DisableFuncTorch():                            # values readable under transforms too
            raise bound_error(ids.detach().cpu().numpy(), weight.shape[0],
                              None if table is None or pos is None else table.shape[0],
                              None if pos is None else pos.detach().cpu().numpy(), None) from None
    if scale == 1.0 and rows is None and not p:
        return x
    low = weight.dtype in _LOW                                                # fp16 / bf16: computed in float32
    if low:
        x = x.float()
    if scale != 1.0:
        x = x * scale
    if rows is not None:
        x = x + (rows if rows.dtype == x.dtype else rows.to(x.dtype))        # broadcast over the batch
    if p > 0.0:
        x = dropout_torch(x, p, seed)
    return x.to(weight.dtype) if low else x


def forward_impl(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None,
                 pos: torch.Tensor | None, scale: float, p: float, seed: torch.Tensor,
                 padding_idx: int) -> torch.Tensor:
    """The implementation of ``tokenpos::embedding`` (the choice: :func:`_path`): on the CPU the numba
    kernel (float32 / float64 / bf16 bits) writing into a fresh tensor, on CUDA the Triton kernel;
    otherwise (fp16, meta, kernels off, and under ``torch.func`` transforms, where a
    tensor's values cannot be handed to a kernel) the formula in differentiable torch ops.
    Shapes and dtypes are valid: the op checks them (``tables.checks.ops``) before it calls this, and
    the layers, which call it directly (``entry.embed``), build them from checked inputs. The values of
    ids and positions are read where they are gathered: one outside its table raises
    :class:`KernelBoundError` naming the first one."""
    path = _path(weight, table)
    if path == "numba":
        out, out_np = cpu_empty((*ids.shape, weight.shape[1]), weight.dtype)
        with_rows = table is not None and pos is not None
        forward_rows(np_view(weight), ids.numpy(), np_view(table) if with_rows else None,  # type: ignore[arg-type]
                     pos.numpy() if with_rows else None, scale, p, int(seed) if p else 0,  # type: ignore[union-attr,arg-type]
                     out_np)
        return out
    if path == "triton":
        tk = triton_kernels(weight) if table is None else triton_kernels(weight, table)
        return tk.embedding_forward(weight, ids, table, pos, scale, p, seed)  # type: ignore[no-any-return]
    return formula(weight, ids, table, pos, scale, p, seed, padding_idx)


@torch.library.custom_op("tokenpos::embedding", mutates_args=())
def embedding(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None,
              pos: torch.Tensor | None, scale: float, p: float, seed: torch.Tensor,
              padding_idx: int) -> torch.Tensor:
    """weight (V, D), ids (...) -> (..., D): gather * scale + table[pos], dropout. See the module doc."""
    check_embedding_args(weight, ids, table, pos, p, seed, padding_idx)
    return forward_impl(weight, as_index(ids), table, None if pos is None else as_index(pos), scale, p, seed,
                        padding_idx)


@embedding.register_fake
def _(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None, pos: torch.Tensor | None,
      scale: float, p: float, seed: torch.Tensor, padding_idx: int) -> torch.Tensor:
    check_embedding_args(weight, ids, table, pos, p, seed, padding_idx)
    return weight.new_empty((*ids.shape, weight.shape[1]))


def _embedding_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    weight, ids, table, pos, scale, p, seed, padding_idx = inputs
    ctx.save_for_backward(ids, pos, seed)
    ctx.num_weights = weight.shape[0]
    ctx.num_positions = 0 if table is None else table.shape[0]
    ctx.args = (scale, p, padding_idx)


def _embedding_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    ids, pos, seed = ctx.saved_tensors
    scale, p, padding_idx = ctx.args
    P = ctx.num_positions if ctx.needs_input_grad[2] else 0
    gw, gt = torch.ops.tokenpos.embedding_backward(grad, ids, pos if P else None, ctx.num_weights, P,
                                                   scale, p, seed, padding_idx)
    return (gw if ctx.needs_input_grad[0] else None), None, (gt if P else None), None, None, None, None, None


embedding.register_autograd(_embedding_grad, setup_context=_embedding_setup)


# ----------------------------------------------------------------------------------------------
# backward (linear in grad)
# ----------------------------------------------------------------------------------------------


def _backward_plain(grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, num_weights: int,
                    num_positions: int, scale: float, p: float, seed: torch.Tensor,
                    padding_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    ct = _compute_dtype(grad.dtype)
    g = grad.to(ct)
    if p > 0.0:
        g = dropout_torch(g, p, seed)                                        # the forward's mask * 1/(1-p)
    D = g.shape[-1]
    flat = g.reshape(-1, D)                                                  # (N, D)
    gw = torch.zeros(num_weights, D, dtype=ct, device=g.device)
    gw.index_add_(0, ids.long().reshape(-1), flat * scale)                  # (V, D)
    if padding_idx >= 0:
        gw[padding_idx] = 0
    gt = torch.zeros(num_positions, D, dtype=ct, device=g.device)
    if num_positions and pos is not None:
        gt.index_add_(0, pos.long().expand(ids.shape).reshape(-1), flat)    # (P, D)
    return gw.to(grad.dtype), gt.to(grad.dtype)


def _backward_numba(grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, num_weights: int,
                    num_positions: int, scale: float, p: float, seed: torch.Tensor,
                    padding_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    with_pos = bool(num_positions) and pos is not None
    uniq, rows, pos_grad = kernel_backward(np_view(grad), np_view(ids), scale=scale, dropout_p=p, seed=int(seed),
                                  padding_idx=None if padding_idx < 0 else padding_idx,
                                  pos_ids=np_view(pos) if with_pos else None,   # type: ignore[arg-type]
                                  num_positions=num_positions if with_pos else None)
    D = grad.shape[-1]
    # dense, like F.embedding; reused memory (``cpu_empty``): a fresh (V, D) torch.zeros page-faults on every
    # step where the gradient was set to None (zero_grad's default): 30 ms against 5 ms for GPT-2's table
    gw = cpu_empty((num_weights, D), grad.dtype)[0].zero_()
    gw.index_copy_(0, torch.from_numpy(uniq), torch.from_numpy(rows))
    gt = torch.from_numpy(pos_grad) if pos_grad is not None else torch.zeros(num_positions, D, dtype=grad.dtype)
    return gw, gt


@torch.library.custom_op("tokenpos::embedding_backward", mutates_args=())
def embedding_backward(grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, num_weights: int,
                       num_positions: int, scale: float, p: float, seed: torch.Tensor,
                       padding_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grad (..., D) -> (grad_weight (V, D), grad_table (P, D)); P = num_positions (0: empty)."""
    check_embedding_backward_args(grad, ids, pos, num_weights, num_positions, p, seed, padding_idx)
    path = _path(grad)
    if path == "numba" and grad.dtype != torch.bfloat16:
        return _backward_numba(grad, ids, pos, num_weights, num_positions, scale, p, seed, padding_idx)
    if path == "triton":
        tk = triton_kernels(grad)
        gw, gt = tk.embedding_backward(grad, ids, pos, num_weights, num_positions, scale, p, seed, padding_idx)
        return gw, (gt if gt is not None else grad.new_zeros(num_positions, grad.shape[-1]))
    return _backward_plain(grad, ids, pos, num_weights, num_positions, scale, p, seed, padding_idx)


@embedding_backward.register_fake
def _(grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, num_weights: int, num_positions: int,
      scale: float, p: float, seed: torch.Tensor, padding_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_embedding_backward_args(grad, ids, pos, num_weights, num_positions, p, seed, padding_idx)
    D = grad.shape[-1]
    return grad.new_empty((num_weights, D)), grad.new_empty((num_positions, D))


def _backward_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ids, pos, num_weights, num_positions, scale, p, seed, padding_idx = inputs
    ctx.save_for_backward(ids, pos, seed)
    ctx.args = (num_positions, scale, p, padding_idx)


def _backward_grad(ctx: Any, gg_weight: torch.Tensor, gg_table: torch.Tensor) -> tuple[Any, ...]:
    """The adjoint of the (linear) backward: the forward op on the incoming gradients."""
    ids, pos, seed = ctx.saved_tensors
    num_positions, scale, p, padding_idx = ctx.args
    if padding_idx >= 0:                                                     # that row never got gradient
        gg_weight = gg_weight.select_scatter(torch.zeros_like(gg_weight[padding_idx]), 0, padding_idx)  # no H2D copy
    table = gg_table if num_positions and pos is not None else None
    gg = torch.ops.tokenpos.embedding(gg_weight, ids, table, pos if table is not None else None, scale, p, seed,
                                      padding_idx)
    return (gg,) + (None,) * 8


embedding_backward.register_autograd(_backward_grad, setup_context=_backward_setup)


# ----------------------------------------------------------------------------------------------
# vmap: a batch of ids folds into the ids' leading dim; anything else runs per sample
# ----------------------------------------------------------------------------------------------


def _take(x: Any, dim: Any, i: int) -> Any:
    return x if dim is None else x.select(dim, i)


def _embedding_vmap(info: Any, in_dims: tuple[Any, ...], weight: torch.Tensor, ids: torch.Tensor,
                    table: torch.Tensor | None, pos: torch.Tensor | None, scale: float, p: float,
                    seed: torch.Tensor, padding_idx: int) -> tuple[torch.Tensor, int]:
    wd, idd, td, pd, _, _, sd, _ = in_dims
    n = info.batch_size
    if wd is None and td is None and sd is None and p == 0.0 and idd is not None:
        ids_b = ids.movedim(idd, 0)                                          # (n, ...)
        pos_b = pos
        if pos is not None and pd is not None:                               # per-sample positions
            pb = pos.movedim(pd, 0)
            pad = ids_b.dim() - pb.dim()
            pos_b = pb.reshape(n, *([1] * pad), *pb.shape[1:]).expand(ids_b.shape)
        return torch.ops.tokenpos.embedding(weight, ids_b, table, pos_b, scale, p, seed, padding_idx), 0
    # dropout (each sample draws the unbatched mask), batched tables or seeds: one call per sample
    outs = [torch.ops.tokenpos.embedding(_take(weight, wd, i), _take(ids, idd, i), _take(table, td, i),
                                         _take(pos, pd, i), scale, p, _take(seed, sd, i), padding_idx)
            for i in range(n)]
    return torch.stack(outs), 0


torch.library.register_vmap("tokenpos::embedding", _embedding_vmap)


def _backward_vmap(info: Any, in_dims: tuple[Any, ...], grad: torch.Tensor, ids: torch.Tensor,
                   pos: torch.Tensor | None, num_weights: int, num_positions: int, scale: float, p: float,
                   seed: torch.Tensor, padding_idx: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    """Per-sample gradients: one dense (V, D) gradient per sample."""
    gd, idd, pd, _, _, _, _, sd, _ = in_dims
    outs = [torch.ops.tokenpos.embedding_backward(_take(grad, gd, i), _take(ids, idd, i), _take(pos, pd, i),
                                                  num_weights, num_positions, scale, p, _take(seed, sd, i),
                                                  padding_idx)
            for i in range(info.batch_size)]
    return (torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])), (0, 0)


torch.library.register_vmap("tokenpos::embedding_backward", _backward_vmap)

