"""``tokenpos::rope`` and ``tokenpos::rope_qk``: rotary position embedding as torch custom ops.

Shapes: B batch, H heads (Hk key heads), L length, Dh head dim, F = R/2 rotated pairs (R <= Dh the
rotary dim). x (B, H, L, Dh); cos / sin (L, F) or (B, L, F), float32 or float64 (never low
precision). Dims R..Dh-1 pass through unchanged.

    half (NeoX / HF):   x1, x2 = x[:F], x[F:R]   ->  [x1*cos - x2*sin, x2*cos + x1*sin]
    interleaved (GPT-J): pairs (2i, 2i+1)       ->  x[2i]*cos - x[2i+1]*sin, x[2i+1]*cos + x[2i]*sin

Arithmetic is in x's dtype for float32 / float64 and in float32 for bf16 / fp16 (rounded once).
The rotation is orthogonal, so the backward is the same op with ``-sin`` (and so is every higher
derivative).
"""

from typing import Any, cast

import numpy as np
import torch

from tokenpos.kernels.rope import rope_apply, run_rope
from tokenpos.torch.ops._dispatch import cpu_empty, cpu_path, np_view, transforms_active, triton_kernels

_LOW = (torch.float16, torch.bfloat16)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _LOW else x.dtype


def _rope_plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The formula in plain torch ops: x (B, H, L, Dh) -> (B, H, L, Dh), contiguous."""
    ct = _compute_dtype(x)
    F = cos.shape[-1]
    R = 2 * F
    c = cos.to(ct).unsqueeze(-3)                         # (1, L, F) or (B, 1, L, F): broadcast over heads
    s = sin.to(ct).unsqueeze(-3)
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
                interleaved: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel pass over x (and k) into fresh outputs (:func:`._dispatch.cpu_empty`): straight to
    the compiled pass when the arguments are in shape, else through :func:`rope_apply` (converts,
    validates and raises the shared messages)."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    xn, cn, sn = np_view(x), np_view(cos), np_view(sin)
    out, out_np = cpu_empty(xn.shape, x.dtype)
    kn = out_k = out_k_np = None
    if k is not None:
        kn = np_view(k)
        out_k, out_k_np = cpu_empty(kn.shape, k.dtype)
    if _in_shape(xn, kn, cn, sn):
        run_rope(xn, xn[:, :0] if kn is None else kn, cn, sn, interleaved, 1.0, True, out_np,
                 out_np[:, :0] if out_k_np is None else out_k_np)
    else:
        rope_apply(xn, kn, cn, sn, layout=_layout(interleaved), out_q=out_np, out_k=out_k_np)
    return out, out_k


def rope_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The implementation of ``tokenpos::rope`` (the choice: ``_dispatch``): the numba kernel on the
    CPU, the Triton kernel on CUDA; otherwise (fp16, meta, kernels off, and under ``torch.func``
    transforms, where a tensor's values cannot be handed to a kernel) the formula in torch ops."""
    if not transforms_active():
        if x.is_cpu and cpu_path(x) == "numba":
            return _rope_numba(x, None, cos, sin, interleaved)[0]
        if x.is_cuda:
            tk = triton_kernels(x)
            if tk is not None:
                return tk.rope_forward(x, cos, sin, interleaved)
    return _rope_plain(x, cos, sin, interleaved)


@torch.library.custom_op("tokenpos::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] dims of x (B, H, L, Dh) -> (B, H, L, Dh)."""
    return rope_impl(x, cos, sin, interleaved)


@rope.register_fake
def _(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rope_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, cos, sin, interleaved = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved = interleaved


def _rope_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    cos, sin = ctx.saved_tensors
    return torch.ops.tokenpos.rope(grad, cos, -sin, ctx.interleaved), None, None, None


rope.register_autograd(_rope_backward, setup_context=_rope_setup)


@torch.library.custom_op("tokenpos::rope_qk", mutates_args=())
def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) -> (q', k'): one kernel pass over both (CPU kernel)."""
    return rope_qk_impl(q, k, cos, sin, interleaved)


def rope_qk_impl(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of ``tokenpos::rope_qk``: one kernel pass over q and k when B, L and Dh
    match, else :func:`rope_impl` on each (both with the same cos / sin)."""
    if (q.is_cpu and k.is_cpu and cpu_path(q, k) == "numba" and k.shape[0] == q.shape[0]
            and k.shape[2:] == q.shape[2:] and not transforms_active()):
        oq, ok = _rope_numba(q, k, cos, sin, interleaved)
        return oq, cast(torch.Tensor, ok)
    return rope_impl(q, cos, sin, interleaved), rope_impl(k, cos, sin, interleaved)


@rope_qk.register_fake
def _(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
      interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))


def _rope_qk_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, _, cos, sin, interleaved = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved = interleaved


def _rope_qk_backward(ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor) -> tuple[Any, ...]:
    cos, sin = ctx.saved_tensors
    gq, gk = torch.ops.tokenpos.rope_qk(grad_q, grad_k, cos, -sin, ctx.interleaved)
    return gq, gk, None, None, None


rope_qk.register_autograd(_rope_qk_backward, setup_context=_rope_qk_setup)


def _rope_vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               interleaved: bool) -> tuple[torch.Tensor, int]:
    """vmap: a batch dim of x folds into B (tables shared) or, with batched tables, into a loop."""
    xd, cd, sd = in_dims[:3]
    n = info.batch_size
    x = x.movedim(xd, 0) if xd is not None else x.expand(n, *x.shape)
    if cd is None and sd is None:
        flat = x.reshape(-1, *x.shape[2:])                                  # (n*B, H, L, Dh)
        c = cos if cos.dim() == 2 else cos.repeat(n, 1, 1)
        s = sin if sin.dim() == 2 else sin.repeat(n, 1, 1)
        return torch.ops.tokenpos.rope(flat, c, s, interleaved).reshape(x.shape), 0
    cos = cos.movedim(cd, 0) if cd is not None else cos.expand(n, *cos.shape)
    sin = sin.movedim(sd, 0) if sd is not None else sin.expand(n, *sin.shape)
    return torch.stack([torch.ops.tokenpos.rope(x[i], cos[i], sin[i], interleaved) for i in range(n)]), 0


torch.library.register_vmap("tokenpos::rope", _rope_vmap)


def _rope_qk_vmap(info: Any, in_dims: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, interleaved: bool) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    qd, kd, cd, sd = in_dims[:4]
    oq, _ = _rope_vmap(info, (qd, cd, sd), q, cos, sin, interleaved)
    ok, _ = _rope_vmap(info, (kd, cd, sd), k, cos, sin, interleaved)
    return (oq, ok), (0, 0)


torch.library.register_vmap("tokenpos::rope_qk", _rope_qk_vmap)

