"""TRANSITIONAL: the RoPE autograd Function that ``torch/rotary.py`` still calls.

The embedding path moved to the ``tokenpos::embedding`` custom op (``tokenpos.torch.ops``). RoPE has
its op too (``tokenpos::rope`` / ``tokenpos::rope_qk``); once ``torch/rotary.py`` calls those, this
module is dead and is deleted.

Shapes: q (B, H, L, Dh), k (B, Hk, L, Dh), cos / sin (L, R/2) or (B, L, R/2) with R the rotary dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tokenpos._config import kernels_enabled
from tokenpos.kernels.rope import rope_apply, rope_apply_backward

FUSED_DTYPES = (torch.float32, torch.float64)
# torch.func transforms wrap tensors (no storage to view); a private flag, so look it up defensively
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def fusable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels apply to these tensors: switch on, eager, CPU, one float32/float64 dtype.

    ``is_compiling`` comes first, so dynamo folds the whole test to False without reading the switch.
    """
    if torch.compiler.is_compiling() or not kernels_enabled() or _transforms_active():
        return False
    dtype = tensors[0].dtype
    return dtype in FUSED_DTYPES and all(t.is_cpu and t.dtype == dtype for t in tensors)


def _np(t: torch.Tensor) -> np.ndarray:
    """The zero-copy NumPy view of a CPU tensor (a strided view when the tensor is not contiguous)."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def _direct_apply(fn: type[torch.autograd.Function]) -> Any:
    """``fn.apply`` without its Python preamble, which only serves ``torch.func`` transforms (they
    never reach here: :func:`fusable` refuses them) and ``setup_context`` Functions (not these).
    Measured: ~25-40 us less per call right after a kernel has streamed the caches cold.
    """
    return super(torch.autograd.Function, fn).apply  # type: ignore[misc]



# ----------------------------------------------------------------------------------------------
# RoPE: rotate q and k in one pass
# ----------------------------------------------------------------------------------------------


def _rope_run(fn: Any, q: np.ndarray, k: np.ndarray | None, tables_q: tuple[np.ndarray, np.ndarray],
              tables_k: tuple[np.ndarray, np.ndarray], layout: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One kernel pass over q and k when they share tables and (B, L); else one pass each."""
    if k is None:
        return fn(q, None, *tables_q, layout=layout)[0], None
    if tables_k is tables_q and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2]:
        return fn(q, k, *tables_q, layout=layout)
    return fn(q, None, *tables_q, layout=layout)[0], fn(k, None, *tables_k, layout=layout)[0]


class _Rope(torch.autograd.Function):
    """q (B, H, L, Dh), k (B, Hk, L', Dh) | None -> rotated (q', k') (k' only when k is given)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor | None, tables_q: tuple[np.ndarray, np.ndarray],
                tables_k: tuple[np.ndarray, np.ndarray], layout: str) -> Any:
        ctx.set_materialize_grads(False)
        ctx.args = (tables_q, tables_k, layout, k is not None)
        oq, ok = _rope_run(rope_apply, _np(q), None if k is None else _np(k), tables_q, tables_k, layout)
        if ok is None:
            return torch.from_numpy(oq)
        out_q, out_k = torch.from_numpy(oq), torch.from_numpy(ok)
        for out, needs in ((out_q, ctx.needs_input_grad[0]), (out_k, ctx.needs_input_grad[1])):
            if not needs:                              # as the plain path: x' requires grad iff x does
                ctx.mark_non_differentiable(out)
        return out_q, out_k

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        tables_q, tables_k, layout, has_k = ctx.args
        gq = grads[0] if ctx.needs_input_grad[0] else None
        gk = grads[1] if has_k and ctx.needs_input_grad[1] else None
        if gq is None and gk is None:
            return None, None, None, None, None
        if gq is None:                                 # only k's gradient: rotate it on its own
            assert gk is not None
            dk_only = rope_apply_backward(_np(gk), None, *tables_k, layout=layout)[0]
            return None, torch.from_numpy(dk_only), None, None, None
        dq, dk = _rope_run(rope_apply_backward, _np(gq), None if gk is None else _np(gk), tables_q, tables_k,
                           layout)
        return torch.from_numpy(dq), None if dk is None else torch.from_numpy(dk), None, None, None


_ROPE_APPLY = _direct_apply(_Rope)


def rope(q: torch.Tensor, k: torch.Tensor | None, tables_q: tuple[np.ndarray, np.ndarray],
         tables_k: tuple[np.ndarray, np.ndarray] | None, layout: str) -> Any:
    """Rotate CPU q (and k) with the kernel; ``tables_*`` are (cos, sin) arrays of shape (L, R/2) or
    (B, L, R/2) in the input dtype (``tables_k`` None: k shares q's). Returns q' or (q', k').
    """
    tk = tables_q if tables_k is None else tables_k
    if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
        return _ROPE_APPLY(q, k, tables_q, tk, layout)
    oq, ok = _rope_run(rope_apply, _np(q), None if k is None else _np(k), tables_q, tk, layout)
    return torch.from_numpy(oq) if ok is None else (torch.from_numpy(oq), torch.from_numpy(ok))
