"""``tokenpos::rope`` and ``tokenpos::rope_qk``: rotary position embedding as torch custom ops, and their
transposes ``tokenpos::rope_backward`` / ``tokenpos::rope_qk_backward`` (the rotation by -angle).

Shapes: B batch, H heads (Hk key heads), L length, Dh head dim, F = R/2 rotated pairs (R <= Dh the
rotary dim). x (B, H, L, Dh) of any strides; cos / sin (L, F), (1, L, F) or (B, L, F), float32 or
float64 (never low precision). Dims R..Dh-1 pass through unchanged. Outputs are always contiguous
(B, H, L, Dh), on every path, as the fake implementations say.

    half (NeoX / HF):   x1, x2 = x[:F], x[F:R]   ->  [x1*cos - x2*sin, x2*cos + x1*sin]
    interleaved (GPT-J): pairs (2i, 2i+1)       ->  x[2i]*cos - x[2i+1]*sin, x[2i+1]*cos + x[2i]*sin

The transpose ops rotate with -sin, negated inside the kernels (numba ``sign``, Triton ``NEG_SIN``).
Arithmetic is in x's dtype for float32 / float64 and in float32 for bf16 / fp16 (rounded once).

Autograd: the rotation is orthogonal, so x's gradient is the transpose op (and the transpose's is the
forward op, so every higher derivative stays on the kernels). cos / sin get their gradients when
they require grad (learned frequencies), from :func:`_table_grads` in differentiable torch ops, summed
over heads and, for shared tables, over the batch; only then is x saved for backward.

Each op (and its fake) runs the one argument check, ``tables.checks.ops.check_rope_args`` /
``check_rope_qk_args``, before it chooses an implementation (numba, Triton, plain torch), so every
implementation refuses or accepts the same calls. The layers reach the implementations directly
(``entry``) with arguments they built from checked inputs, and are not checked twice.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from tokenpos.kernels.rope import rope_apply, rope_apply_backward, run_rope
from tokenpos.tables.checks.ops import check_rope_args, check_rope_qk_args
from tokenpos.torch.ops._dispatch import cpu_empty, cpu_path, np_view, transforms_active, triton_kernels

_LOW = (torch.float16, torch.bfloat16)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _LOW else x.dtype


def _rope_plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                neg: bool) -> torch.Tensor:
    """The formula in plain torch ops: x (B, H, L, Dh) -> (B, H, L, Dh), contiguous."""
    ct = _compute_dtype(x)
    F = cos.shape[-1]
    R = 2 * F
    c = cos.to(ct).unsqueeze(-3)                         # (1, L, F) or (B, 1, L, F): broadcast over heads
    s = sin.to(ct).unsqueeze(-3)
    if neg:
        s = -s
    xr = x[..., :R].to(ct)                               # (B, H, L, R)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]            # (B, H, L, F)
        rot = torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :F], xr[..., F:]
        rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return torch.cat([rot.to(x.dtype), x[..., R:]], dim=-1).contiguous()


def _layout(interleaved: bool) -> str:
    return "interleaved" if interleaved else "half"


def _in_shape(x: np.ndarray, k: np.ndarray | None, cos: np.ndarray, sin: np.ndarray) -> bool:
    """Whether :func:`run_rope` can take these NumPy views as they are: contiguous 4-D x (and k with
    x's B, L, Dh), contiguous cos / sin of x's dtype, (L, F) or (B, L, F), with 2F <= Dh."""
    if not (x.ndim == 4 and x.flags.c_contiguous and cos.dtype == x.dtype and sin.dtype == x.dtype
            and cos.flags.c_contiguous and sin.flags.c_contiguous and cos.shape == sin.shape):
        return False
    B, _, L, Dh = x.shape
    if k is not None and not (k.ndim == 4 and k.flags.c_contiguous and k.shape[0] == B
                              and k.shape[2:] == x.shape[2:]):
        return False
    c = cos.shape
    return (len(c) == 2 or (len(c) == 3 and c[0] == B)) and c[-2] == L and 2 * c[-1] <= Dh


def _rope_numba(x: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                interleaved: bool, neg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel pass over x (and k, of x's dtype, B, L and Dh) into fresh contiguous outputs
    (:func:`._dispatch.cpu_empty`): straight to the compiled pass when the arguments are in shape, else
    through :func:`rope_apply` / :func:`rope_apply_backward`, which copy strided inputs first."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    xn, cn, sn = np_view(x), np_view(cos), np_view(sin)
    out, out_np = cpu_empty(xn.shape, x.dtype)
    kn = out_k = out_k_np = None
    if k is not None:
        kn = np_view(k)
        out_k, out_k_np = cpu_empty(kn.shape, k.dtype)
    if _in_shape(xn, kn, cn, sn):
        run_rope(xn, xn[:, :0] if kn is None else kn, cn, sn, interleaved, -1.0 if neg else 1.0, True, out_np,
                 out_np[:, :0] if out_k_np is None else out_k_np)
    else:
        apply = rope_apply_backward if neg else rope_apply
        apply(xn, kn, cn, sn, layout=_layout(interleaved), out_q=out_np, out_k=out_k_np)
    return out, out_k


def _path(x: torch.Tensor, k: torch.Tensor | None = None) -> str:
    """"numba", "triton" or "plain" for x (and k): ``_dispatch``'s choice for RoPE (no bf16 kernel on the
    CPU; plain torch under ``torch.func`` transforms, where a tensor's values cannot reach a kernel)."""
    if transforms_active():
        return "plain"
    if x.is_cuda:
        return "plain" if triton_kernels(*((x,) if k is None else (x, k))) is None else "triton"
    return "numba" if x.is_cpu and cpu_path(x, k) == "numba" else "plain"


def _float32(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path's tables: float32, the dtype every other path computes its float32 / bf16 / fp16
    inputs in (float64 tables would take the kernel's float64 branch and round differently; the layers
    already pass float32)."""
    return (cos, sin) if cos.dtype == torch.float32 else (cos.float(), sin.float())


def _one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, neg: bool) -> torch.Tensor:
    """x rotated (by -angle when ``neg``) on its path; arguments already checked."""
    path = _path(x)
    if path == "numba":
        return _rope_numba(x, None, cos, sin, interleaved, neg)[0]
    if path == "triton":
        tk = triton_kernels(x)
        cos, sin = _float32(cos, sin)
        return cast(torch.Tensor, (tk.rope_backward if neg else tk.rope_forward)(x, cos, sin, interleaved))
    return _rope_plain(x, cos, sin, interleaved, neg)


def rotate_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                neg: bool = False) -> torch.Tensor:
    """The implementation of ``tokenpos::rope`` (``neg``: ``tokenpos::rope_backward``) on valid arguments
    (the op checks them first; the layers build them from checked inputs): the numba kernel on the
    CPU, the Triton kernel on CUDA, else the formula in torch ops."""
    return _one(x, cos, sin, interleaved, neg)


def rope_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The implementation of ``tokenpos::rope``: x (B, H, L, Dh) -> (B, H, L, Dh)."""
    return rotate_impl(x, cos, sin, interleaved)


def rotate_qk_impl(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                   neg: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of ``tokenpos::rope_qk`` (``neg``: ``rope_qk_backward``) on valid arguments (as
    :func:`rotate_impl`): one kernel pass over q and k (numba: when k has q's dtype and Dh; Triton: the
    one launch of ``kernels.triton.rope_qk``, whatever Hk, two launches only when dtype or Dh differ),
    else one rotation per tensor."""
    path = _path(q, k)
    if path == "numba" and k.shape[3] == q.shape[3]:
        oq, ok = _rope_numba(q, k, cos, sin, interleaved, neg)
        return oq, cast(torch.Tensor, ok)
    if path == "triton":
        tk = triton_kernels(q, k)
        cos, sin = _float32(cos, sin)
        return (tk.rope_qk_backward if neg else tk.rope_qk)(q, k, cos, sin, interleaved)  # type: ignore[no-any-return]
    return _one(q, cos, sin, interleaved, neg), _one(k, cos, sin, interleaved, neg)


def rope_qk_impl(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of ``tokenpos::rope_qk``: (q', k') of q's and k's shapes."""
    return rotate_qk_impl(q, k, cos, sin, interleaved)


# ----------------------------------------------------------------------------------------------
# gradients: x through the transpose op, cos / sin in torch ops
# ----------------------------------------------------------------------------------------------


def _table_grads(g: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, interleaved: bool,
                 neg: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dcos, dsin) of cos's shape and dtype for the rotation of x (B, H, L, Dh) with output gradient g.

    half: out1 = x1*c - x2*s, out2 = x2*c + x1*s  ->  dc = g1*x1 + g2*x2, ds = g2*x1 - g1*x2 (negated for
    the transpose, which rotates by -s), summed over heads, and over the batch for a shared table.
    interleaved: the same with x1, x2 = x[0::2], x[1::2]. Differentiable (double backward).
    """
    ct = torch.promote_types(_compute_dtype(x), cos.dtype)
    F = cos.shape[-1]
    xr, gr = x[..., :2 * F].to(ct), g[..., :2 * F].to(ct)
    if interleaved:
        x1, x2, g1, g2 = xr[..., 0::2], xr[..., 1::2], gr[..., 0::2], gr[..., 1::2]
    else:
        x1, x2, g1, g2 = xr[..., :F], xr[..., F:], gr[..., :F], gr[..., F:]
    dc = (g1 * x1 + g2 * x2).sum(-3)                                      # (B, L, F)
    ds = (g2 * x1 - g1 * x2).sum(-3)
    if neg:
        ds = -ds
    if cos.dim() == 2:
        dc, ds = dc.sum(0), ds.sum(0)                                     # (L, F)
    elif cos.shape[0] != dc.shape[0]:
        dc, ds = dc.sum(0, keepdim=True), ds.sum(0, keepdim=True)         # (1, L, F)
    return dc.to(cos.dtype), ds.to(cos.dtype)


def save_rope(ctx: Any, xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
              neg: bool) -> None:
    """What the backward needs: cos, sin, and the inputs xs only when cos or sin require grad."""
    tables = cos.requires_grad or sin.requires_grad
    ctx.save_for_backward(cos, sin, *(xs if tables else ()))
    ctx.interleaved, ctx.neg = interleaved, neg


def rope_grads(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
    """Gradients of the inputs (x..., cos, sin) of a rotation saved by :func:`save_rope`: the xs through
    the transpose op, in one pass (one launch) for q and k; cos / sin from :func:`_table_grads`."""
    cos, sin, *xs = ctx.saved_tensors
    n, neg, il = len(grads), ctx.neg, ctx.interleaved
    needs = ctx.needs_input_grad
    out: list[Any] = [None] * n
    if any(needs[:n]):
        op = getattr(torch.ops.tokenpos, ("rope_qk" if n == 2 else "rope") + ("" if neg else "_backward"))
        out = list(op(*grads, cos, sin, il)) if n == 2 else [op(grads[0], cos, sin, il)]
        out = [o if needs[i] else None for i, o in enumerate(out)]
    dc: Any = None
    ds: Any = None
    if xs and (needs[n] or needs[n + 1]):
        for g, x in zip(grads, xs, strict=True):
            c, s = _table_grads(g, x, cos, il, neg)
            dc, ds = (c, s) if dc is None else (dc + c, ds + s)
    return (*out, dc if needs[n] else None, ds if needs[n + 1] else None, None)


# ----------------------------------------------------------------------------------------------
# the ops
# ----------------------------------------------------------------------------------------------


def _fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    check_rope_args(x, cos, sin)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_rope_qk_args(q, k, cos, sin)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))


@torch.library.custom_op("tokenpos::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] dims of x (B, H, L, Dh) -> (B, H, L, Dh)."""
    check_rope_args(x, cos, sin)
    return rotate_impl(x, cos, sin, interleaved)


@torch.library.custom_op("tokenpos::rope_backward", mutates_args=())
def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The transpose of :func:`rope` (rotation by -angle): grad (B, H, L, Dh) -> (B, H, L, Dh)."""
    check_rope_args(grad, cos, sin)
    return rotate_impl(grad, cos, sin, interleaved, True)


@torch.library.custom_op("tokenpos::rope_qk", mutates_args=())
def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) -> (q', k'): one kernel pass over both."""
    check_rope_qk_args(q, k, cos, sin)
    return rotate_qk_impl(q, k, cos, sin, interleaved)


@torch.library.custom_op("tokenpos::rope_qk_backward", mutates_args=())
def rope_qk_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The transpose of :func:`rope_qk`: (grad_q, grad_k) -> (dq, dk), one kernel pass over both."""
    check_rope_qk_args(grad_q, grad_k, cos, sin)
    return rotate_qk_impl(grad_q, grad_k, cos, sin, interleaved, True)


for _op, _neg in ((rope, False), (rope_backward, True)):
    _op.register_fake(_fake)
    _op.register_autograd(
        lambda ctx, grad: rope_grads(ctx, grad),
        setup_context=lambda ctx, inputs, output, neg=_neg: save_rope(ctx, inputs[:1], inputs[1], inputs[2],
                                                                      inputs[3], neg))
for _op, _neg in ((rope_qk, False), (rope_qk_backward, True)):
    _op.register_fake(_fake_qk)
    _op.register_autograd(
        lambda ctx, grad_q, grad_k: rope_grads(ctx, grad_q, grad_k),
        setup_context=lambda ctx, inputs, output, neg=_neg: save_rope(ctx, inputs[:2], inputs[2], inputs[3],
                                                                      inputs[4], neg))


# ----------------------------------------------------------------------------------------------
# vmap
# ----------------------------------------------------------------------------------------------


def _vmap_one(op: Any, info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              interleaved: bool) -> tuple[torch.Tensor, int]:
    """vmap: a batch dim of x folds into B (tables shared) or, with batched tables, into a loop."""
    xd, cd, sd = in_dims[:3]
    n = info.batch_size
    x = x.movedim(xd, 0) if xd is not None else x.expand(n, *x.shape)
    if cd is None and sd is None:
        flat = x.reshape(-1, *x.shape[2:])                                  # (n*B, H, L, Dh)
        c = cos if cos.dim() == 2 or cos.shape[0] == 1 else cos.repeat(n, 1, 1)
        s = sin if sin.dim() == 2 or sin.shape[0] == 1 else sin.repeat(n, 1, 1)
        return op(flat, c, s, interleaved).reshape(x.shape), 0
    cos = cos.movedim(cd, 0) if cd is not None else cos.expand(n, *cos.shape)
    sin = sin.movedim(sd, 0) if sd is not None else sin.expand(n, *sin.shape)
    return torch.stack([op(x[i], cos[i], sin[i], interleaved) for i in range(n)]), 0


def _vmap_qk(op: Any, info: Any, in_dims: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, interleaved: bool) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    qd, kd, cd, sd = in_dims[:4]
    oq, _ = _vmap_one(op, info, (qd, cd, sd), q, cos, sin, interleaved)
    ok, _ = _vmap_one(op, info, (kd, cd, sd), k, cos, sin, interleaved)
    return (oq, ok), (0, 0)


for _name, _one_op in (("rope", "rope"), ("rope_backward", "rope_backward")):
    torch.library.register_vmap(f"tokenpos::{_name}",
                                lambda info, in_dims, *args, _o=_one_op: _vmap_one(
                                    getattr(torch.ops.tokenpos, _o), info, in_dims, *args))
for _name, _one_op in (("rope_qk", "rope"), ("rope_qk_backward", "rope_backward")):
    torch.library.register_vmap(f"tokenpos::{_name}",
                                lambda info, in_dims, *args, _o=_one_op: _vmap_qk(
                                    getattr(torch.ops.tokenpos, _o), info, in_dims, *args))
