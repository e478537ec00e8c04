"""``tokenpos::rope`` and ``tokenpos::rope_qk``: rotary position embedding as torch custom ops, and their
transposes ``tokenpos::rope_backward`` / ``tokenpos::rope_qk_backward`` (the rotation by -angle).

Shapes: B batch, H heads (Hk key heads), L length, Dh head dim, F = R/2 rotated pairs (R <= Dh the
rotary dim), P table rows. x (B, H, L, Dh) of any strides; cos / sin (L, F), (1, L, F) or (B, L, F), float32
or float64 (never low precision); or, with the optional ``positions`` (L,), (1, L) or (B, L) integers in
[0, P), one (P, F) table whose row ``positions[b, l]`` rotates token (b, l): a cached table read by
position (packed documents), in the same kernel pass. Dims R..Dh-1 pass through unchanged. Outputs are always contiguous
(B, H, L, Dh), on every path, as the fake implementations say.

    half (NeoX / HF):   x1, x2 = x[:F], x[F:R]   ->  [x1*cos - x2*sin, x2*cos + x1*sin]
    interleaved (GPT-J): pairs (2i, 2i+1)       ->  x[2i]*cos - x[2i+1]*sin, x[2i+1]*cos + x[2i]*sin

The transpose ops rotate with -sin, negated inside the kernels (numba ``sign``, Triton ``NEG_SIN``).
Arithmetic is in x's dtype for float32 / float64 and in float32 for bf16 / fp16 (rounded once).

Autograd: the rotation is orthogonal, so x's gradient is the transpose op (and the transpose's is the
forward op, so every higher derivative stays on the kernels). cos / sin get their gradients when
they require grad (learned frequencies), from :func:`_table_grads` in differentiable torch ops, summed
over heads and, for shared tables, over the batch (tables read by position: added into the rows read);
only then is x saved for backward. ``positions`` has no gradient.

Each op (and its fake) runs the one argument check, ``tables.checks.ops.check_rope_args`` /
``check_rope_qk_args``, before it chooses an implementation (numba, Triton, plain torch), so every
implementation refuses or accepts the same calls; the op (not its fake) then checks the values of
``positions`` (:func:`check_positions_values`: read on the CPU, a device-side assert elsewhere). The
layers reach the implementations directly (``entry``) with arguments they built from checked inputs,
and are not checked twice.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from tokenpos._config import kernels_enabled
from tokenpos.kernels.rope import NO_POSITIONS, rope_apply, rope_apply_backward, run_rope
from tokenpos.tables.checks.ops import check_rope_args, check_rope_qk_args
from tokenpos.tables.checks.validation import check_positions
from tokenpos.torch._checks import transforms_active
from tokenpos.torch.ops._dispatch import cpu_empty, triton_kernels

_LOW = (torch.float16, torch.bfloat16)
_KERNEL_DTYPES = (torch.float32, torch.float64)    # the numba RoPE kernel's (no bf16 kernel on the CPU)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _LOW else x.dtype


def check_positions_values(positions: torch.Tensor | None, rows: int) -> None:
    """The op's check of ``positions``' values, each in [0, rows): read on the CPU (PositionError), one
    device-side assert elsewhere (no host sync); nothing for fake / meta tensors."""
    if positions is None or positions.is_meta or isinstance(positions, torch._subclasses.FakeTensor):
        return
    if positions.is_cpu:
        check_positions(positions.detach().numpy(), rows)
        return
    torch._assert_async(((positions >= 0) & (positions < rows)).all(),
                        f"rope positions must be in [0, {rows}) (the rows of cos / sin; a device-side check)")


def _indexed(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables (L, F) / (Bp, L, F) a call reads: cos / sin themselves, or their rows at ``positions``."""
    if positions is None:
        return cos, sin
    return cos[positions], sin[positions]


def _rope_plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                neg: bool, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The formula in plain torch ops: x (B, H, L, Dh) -> (B, H, L, Dh), contiguous."""
    cos, sin = _indexed(cos, sin, positions)
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


def _in_shape(x: np.ndarray, k: np.ndarray | None, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray | None) -> bool:
    """Whether :func:`run_rope` can take these NumPy views as they are: contiguous 4-D x (and k with
    x's B, L, Dh), contiguous cos / sin of x's dtype, (L, F), (1, L, F) or (B, L, F), with 2F <= Dh; or
    with ``pos`` (checked int64, contiguous), one (P, F) table. Exactly what :func:`run_rope` takes:
    anything else goes through :func:`rope_apply`, which validates and copies."""
    if not (x.ndim == 4 and x.flags.c_contiguous and cos.dtype == x.dtype and sin.dtype == x.dtype
            and cos.flags.c_contiguous and sin.flags.c_contiguous and cos.shape == sin.shape):
        return False
    B, _, L, Dh = x.shape
    if k is not None and not (k.ndim == 4 and k.flags.c_contiguous and k.shape[0] == B
                              and k.shape[2:] == x.shape[2:]):
        return False
    c = cos.shape
    if pos is not None:
        return len(c) == 2 and 2 * c[-1] <= Dh and pos.dtype == np.int64 and pos.flags.c_contiguous
    return (len(c) == 2 or (len(c) == 3 and c[0] in (1, B))) and c[-2] == L and 2 * c[-1] <= Dh


def _rope_numba(x: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                interleaved: bool, neg: bool, positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel pass over x (and k, of x's dtype, B, L and Dh) into fresh contiguous outputs
    (:func:`._dispatch.cpu_empty`): straight to the compiled pass when the arguments are in shape, else
    through :func:`rope_apply` / :func:`rope_apply_backward`, which copy strided inputs first."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    pn = None if positions is None else positions.to(torch.int64).contiguous().numpy()
    xn, cn, sn = x.numpy(force=True), cos.numpy(force=True), sin.numpy(force=True)    # zero-copy views
    out, out_np = cpu_empty(xn.shape, x.dtype)
    kn = out_k = out_k_np = None
    if k is not None:
        kn = k.numpy(force=True)
        out_k, out_k_np = cpu_empty(kn.shape, k.dtype)
    if _in_shape(xn, kn, cn, sn, pn):
        run_rope(xn, xn[:, :0] if kn is None else kn, cn, sn, interleaved, -1.0 if neg else 1.0, True, out_np,
                 out_np[:, :0] if out_k_np is None else out_k_np, NO_POSITIONS if pn is None else pn)
    else:
        apply = rope_apply_backward if neg else rope_apply
        apply(xn, kn, cn, sn, layout=_layout(interleaved), out_q=out_np, out_k=out_k_np, positions=pn)
    return out, out_k


def _path(x: torch.Tensor, k: torch.Tensor | None = None) -> str:
    """"numba", "triton" or "plain" for x (and k): ``_dispatch``'s choice for RoPE (no bf16 kernel on the
    CPU; plain torch under ``torch.func`` transforms, where a tensor's values cannot reach a kernel)."""
    if transforms_active():
        return "plain"
    if x.is_cuda:
        return "plain" if triton_kernels(*((x,) if k is None else (x, k))) is None else "triton"
    return ("numba" if x.is_cpu and x.dtype in _KERNEL_DTYPES and (k is None or k.dtype == x.dtype)
            and kernels_enabled() else "plain")


def _float32(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path's tables: float32, the dtype every other path computes its float32 / bf16 / fp16
    inputs in (float64 tables would take the kernel's float64 branch and round differently; the layers
    already pass float32)."""
    return (cos, sin) if cos.dtype == torch.float32 else (cos.float(), sin.float())


def rotate_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                neg: bool = False, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The implementation of ``tokenpos::rope`` (``neg``: ``tokenpos::rope_backward``): x (B, H, L, Dh)
    rotated (by -angle when ``neg``) -> (B, H, L, Dh), on valid arguments (the op checks them first; the
    layers build them from checked inputs): the numba kernel on the CPU, the Triton kernel on CUDA,
    else the formula in torch ops."""
    path = _path(x)
    if path == "numba":
        return _rope_numba(x, None, cos, sin, interleaved, neg, positions)[0]
    if path == "triton":
        tk = triton_kernels(x)
        cos, sin = _float32(cos, sin)
        fn = tk.rope_backward if neg else tk.rope_forward
        return cast(torch.Tensor, fn(x, cos, sin, interleaved, positions=positions))
    return _rope_plain(x, cos, sin, interleaved, neg, positions)


def rotate_qk_impl(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                   neg: bool = False, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of ``tokenpos::rope_qk`` (``neg``: ``rope_qk_backward``): (q', k') of q's and k's
    shapes, on valid arguments (as :func:`rotate_impl`): one kernel pass over q and k (numba: when k has
    q's dtype and Dh; Triton: the one launch of ``kernels.triton.rope_qk``, whatever Hk, two launches
    only when dtype or Dh differ), else one rotation per tensor."""
    path = _path(q, k)
    if path == "numba" and k.shape[3] == q.shape[3]:
        oq, ok = _rope_numba(q, k, cos, sin, interleaved, neg, positions)
        return oq, cast(torch.Tensor, ok)
    if path == "triton":
        tk = triton_kernels(q, k)
        cos, sin = _float32(cos, sin)
        fn = tk.rope_qk_backward if neg else tk.rope_qk
        return fn(q, k, cos, sin, interleaved, positions=positions)  # type: ignore[no-any-return]
    return rotate_impl(q, cos, sin, interleaved, neg, positions), rotate_impl(k, cos, sin, interleaved, neg, positions)


# ----------------------------------------------------------------------------------------------
# gradients: x through the transpose op, cos / sin in torch ops
# ----------------------------------------------------------------------------------------------


def _table_grads(g: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, interleaved: bool,
                 neg: bool, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dcos, dsin) of cos's shape and dtype for the rotation of x (B, H, L, Dh) with output gradient g.

    half: out1 = x1*c - x2*s, out2 = x2*c + x1*s  ->  dc = g1*x1 + g2*x2, ds = g2*x1 - g1*x2 (negated for
    the transpose, which rotates by -s), summed over heads, and over the batch for a shared table;
    with ``positions``, added into the (P, F) rows read (``index_add``).
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
    if positions is not None:                                             # (P, F): into the rows read
        idx = positions.expand(dc.shape[:2]).reshape(-1)
        zero = torch.zeros(cos.shape, dtype=dc.dtype, device=dc.device)
        dc = zero.index_add(0, idx, dc.reshape(-1, F))
        ds = zero.index_add(0, idx, ds.reshape(-1, F))
    elif cos.dim() == 2:
        dc, ds = dc.sum(0), ds.sum(0)                                     # (L, F)
    elif cos.shape[0] != dc.shape[0]:
        dc, ds = dc.sum(0, keepdim=True), ds.sum(0, keepdim=True)         # (1, L, F)
    return dc.to(cos.dtype), ds.to(cos.dtype)


def save_rope(ctx: Any, xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
              neg: bool, positions: torch.Tensor | None = None) -> None:
    """What the backward needs: cos, sin, positions, and the inputs xs only when cos or sin require grad."""
    tables = cos.requires_grad or sin.requires_grad
    ctx.save_for_backward(cos, sin, *(() if positions is None else (positions,)), *(xs if tables else ()))
    ctx.interleaved, ctx.neg, ctx.indexed = interleaved, neg, positions is not None


def rope_grads(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
    """Gradients of the inputs (x..., cos, sin, interleaved, positions) of a rotation saved by
    :func:`save_rope`: the xs through the transpose op, in one pass (one launch) for q and k; cos / sin
    from :func:`_table_grads`; none for interleaved and positions."""
    cos, sin, *xs = ctx.saved_tensors
    pos = xs.pop(0) if ctx.indexed else None
    n, neg, il = len(grads), ctx.neg, ctx.interleaved
    needs = ctx.needs_input_grad
    out: list[Any] = [None] * n
    if any(needs[:n]):
        op = getattr(torch.ops.tokenpos, ("rope_qk" if n == 2 else "rope") + ("" if neg else "_backward"))
        out = list(op(*grads, cos, sin, il, pos)) if n == 2 else [op(grads[0], cos, sin, il, pos)]
        out = [o if needs[i] else None for i, o in enumerate(out)]
    dc: Any = None
    ds: Any = None
    if xs and (needs[n] or needs[n + 1]):
        for g, x in zip(grads, xs, strict=True):
            c, s = _table_grads(g, x, cos, il, neg, pos)
            dc, ds = (c, s) if dc is None else (dc + c, ds + s)
    return (*out, dc if needs[n] else None, ds if needs[n + 1] else None, None, None)


# ----------------------------------------------------------------------------------------------
# the ops
# ----------------------------------------------------------------------------------------------


def _fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
          positions: torch.Tensor | None = None) -> torch.Tensor:
    check_rope_args(x, cos, sin, positions)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             interleaved: bool, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_rope_qk_args(q, k, cos, sin, positions)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))


@torch.library.custom_op("tokenpos::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
         positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] dims of x (B, H, L, Dh) -> (B, H, L, Dh) (tables read at
    ``positions`` when given)."""
    check_rope_args(x, cos, sin, positions)
    check_positions_values(positions, cos.shape[0])
    return rotate_impl(x, cos, sin, interleaved, False, positions)


@torch.library.custom_op("tokenpos::rope_backward", mutates_args=())
def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """The transpose of :func:`rope` (rotation by -angle): grad (B, H, L, Dh) -> (B, H, L, Dh)."""
    check_rope_args(grad, cos, sin, positions)
    check_positions_values(positions, cos.shape[0])
    return rotate_impl(grad, cos, sin, interleaved, True, positions)


@torch.library.custom_op("tokenpos::rope_qk", mutates_args=())
def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            interleaved: bool, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) -> (q', k'): one kernel pass over both."""
    check_rope_qk_args(q, k, cos, sin, positions)
    check_positions_values(positions, cos.shape[0])
    return rotate_qk_impl(q, k, cos, sin, interleaved, False, positions)


@torch.library.custom_op("tokenpos::rope_qk_backward", mutates_args=())
def rope_qk_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     interleaved: bool, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The transpose of :func:`rope_qk`: (grad_q, grad_k) -> (dq, dk), one kernel pass over both."""
    check_rope_qk_args(grad_q, grad_k, cos, sin, positions)
    check_positions_values(positions, cos.shape[0])
    return rotate_qk_impl(grad_q, grad_k, cos, sin, interleaved, True, positions)


for _op, _neg in ((rope, False), (rope_backward, True)):
    _op.register_fake(_fake)
    _op.register_autograd(
        lambda ctx, grad: rope_grads(ctx, grad),
        setup_context=lambda ctx, inputs, output, neg=_neg: save_rope(ctx, inputs[:1], inputs[1], inputs[2],
                                                                      inputs[3], neg, inputs[4]))
for _op, _neg in ((rope_qk, False), (rope_qk_backward, True)):
    _op.register_fake(_fake_qk)
    _op.register_autograd(
        lambda ctx, grad_q, grad_k: rope_grads(ctx, grad_q, grad_k),
        setup_context=lambda ctx, inputs, output, neg=_neg: save_rope(ctx, inputs[:2], inputs[2], inputs[3],
                                                                      inputs[4], neg, inputs[5]))


# ----------------------------------------------------------------------------------------------
# vmap
# ----------------------------------------------------------------------------------------------


def _vmap_one(op: Any, info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              interleaved: bool, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """vmap: a batch dim of x folds into B (tables and positions shared) or, with batched tables or
    positions, into a loop."""
    xd, cd, sd = in_dims[:3]
    pd = in_dims[4] if len(in_dims) > 4 else None
    n = info.batch_size
    x = x.movedim(xd, 0) if xd is not None else x.expand(n, *x.shape)
    if cd is None and sd is None and pd is None:
        flat = x.reshape(-1, *x.shape[2:])                                  # (n*B, H, L, Dh)
        if positions is not None:                                          # (L,) / (1, L) shared, (B, L) repeated
            p = positions if positions.dim() == 1 or positions.shape[0] == 1 else positions.repeat(n, 1)
            return op(flat, cos, sin, interleaved, p).reshape(x.shape), 0
        c = cos if cos.dim() == 2 or cos.shape[0] == 1 else cos.repeat(n, 1, 1)
        s = sin if sin.dim() == 2 or sin.shape[0] == 1 else sin.repeat(n, 1, 1)
        return op(flat, c, s, interleaved).reshape(x.shape), 0
    cos = cos.movedim(cd, 0) if cd is not None else cos.expand(n, *cos.shape)
    sin = sin.movedim(sd, 0) if sd is not None else sin.expand(n, *sin.shape)
    if positions is None:
        return torch.stack([op(x[i], cos[i], sin[i], interleaved) for i in range(n)]), 0
    pos = positions.movedim(pd, 0) if pd is not None else positions.expand(n, *positions.shape)
    return torch.stack([op(x[i], cos[i], sin[i], interleaved, pos[i]) for i in range(n)]), 0


def _vmap_qk(op: Any, info: Any, in_dims: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, interleaved: bool, positions: torch.Tensor | None = None
             ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    qd, kd, cd, sd = in_dims[:4]
    pd = in_dims[5] if len(in_dims) > 5 else None
    oq, _ = _vmap_one(op, info, (qd, cd, sd, None, pd), q, cos, sin, interleaved, positions)
    ok, _ = _vmap_one(op, info, (kd, cd, sd, None, pd), k, cos, sin, interleaved, positions)
    return (oq, ok), (0, 0)


for _name, _one_op in (("rope", "rope"), ("rope_backward", "rope_backward")):
    torch.library.register_vmap(f"tokenpos::{_name}",
                                lambda info, in_dims, *args, _o=_one_op: _vmap_one(
                                    getattr(torch.ops.tokenpos, _o), info, in_dims, *args))
for _name, _one_op in (("rope_qk", "rope"), ("rope_qk_backward", "rope_backward")):
    torch.library.register_vmap(f"tokenpos::{_name}",
                                lambda info, in_dims, *args, _o=_one_op: _vmap_qk(
                                    getattr(torch.ops.tokenpos, _o), info, in_dims, *args))
