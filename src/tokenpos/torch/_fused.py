"""The fused numba kernels behind the torch layers: autograd Functions over zero-copy ``.numpy()`` views.

A layer asks :func:`fusable` first: the kernels apply when ``tokenpos.kernels_enabled()``, outside
``torch.compile`` tracing and ``torch.func`` transforms (grad, vmap, ...: their wrapped tensors have
no NumPy view), to CPU tensors of one dtype, float32 or float64. Everything else (GPUs, bf16 / fp16,
compiled graphs, transforms) takes the layer's plain torch path, which gives the same numbers up to
float rounding and the same dropout masks bit for bit.

Outputs are the kernels' own arrays wrapped by ``torch.from_numpy`` (no copy). The kernels hand out
large outputs from a small pool of dead same-size buffers (``tokenpos.kernels._pool``), which saves
the page faults a fresh ``torch.empty`` of tens of MB costs on every call.

When nothing needs a gradient (``torch.no_grad()``, ``inference_mode``, frozen tables) the kernel is
called directly; otherwise through a ``torch.autograd.Function`` whose backward is the kernel's own
(the dropout mask is recomputed from the seed; nothing but the ids and positions is saved).

Shapes: V vocab, D model dim, P positions, ids (...); q (B, H, L, Dh), k (B, Hk, L, Dh), cos / sin
(L, R/2) or (B, L, R/2) with R the rotary dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tokenpos._config import kernels_enabled
from tokenpos.kernels.embedding import embedding_backward, embedding_forward
from tokenpos.kernels.rope import rope_apply, rope_apply_backward
from tokenpos.tables.validation import check_token_ids as np_check_token_ids
from tokenpos.torch._checks import _INT_DTYPES as INT_DTYPES

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


# ----------------------------------------------------------------------------------------------
# embedding: gather * scale + positional row + dropout
# ----------------------------------------------------------------------------------------------


def checked_ids(ids: Any, vocab_size: int) -> np.ndarray | None:
    """The zero-copy int64 view of CPU integer ids with every value checked in [0, vocab_size), or
    None when ids are not a CPU integer tensor (the caller then runs the torch check).

    Raises:
        TokenIdError: a value out of range, with the shared message (the torch check raises through
            this same NumPy check).
    """
    if (not isinstance(ids, torch.Tensor) or not ids.is_cpu or ids.dtype not in INT_DTYPES or ids.is_nested
            or ids.layout != torch.strided):
        return None
    return np_check_token_ids(ids.numpy(), vocab_size)


Positions = torch.Tensor | np.ndarray | None


def _pos_np(pos: Positions) -> np.ndarray | None:
    return pos if pos is None or isinstance(pos, np.ndarray) else pos.numpy()


class _Embedding(torch.autograd.Function):
    """weight (V, D), table (P, D) | None, ids (...), pos (...) | trailing part | None -> (..., D)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, table: torch.Tensor | None, ids: torch.Tensor, pos: Positions,
                scale: float, p: float, seed: int, padding_idx: int | None) -> torch.Tensor:
        # tensors through save_for_backward (version-checked, as F.embedding); a NumPy pos is the layer's own
        tensor_pos = isinstance(pos, torch.Tensor)
        ctx.save_for_backward(ids, pos if tensor_pos else None)
        ctx.args = (weight.shape, None if table is None else table.shape[0], scale, p, seed, padding_idx,
                    None if tensor_pos else pos)
        return _embedding_forward(weight, table, ids, pos, scale, p, seed)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        need_w, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ids, pos = ctx.saved_tensors
        shape, P, scale, p, seed, padding_idx, pos_np = ctx.args
        uniq, rows, pos_grad = embedding_backward(
            _np(grad), ids.numpy(), scale=scale, dropout_p=p, seed=seed, padding_idx=padding_idx,
            pos_ids=_pos_np(pos if pos_np is None else pos_np) if need_t else None,
            num_positions=P if need_t else None)
        grad_w = None
        if need_w:                                     # dense, like F.embedding(sparse=False)
            grad_w = torch.zeros(shape, dtype=grad.dtype)
            grad_w.index_copy_(0, torch.from_numpy(uniq), torch.from_numpy(rows))
        grad_t = torch.from_numpy(pos_grad) if need_t and pos_grad is not None else None
        return grad_w, grad_t, None, None, None, None, None, None


def _direct_apply(fn: type[torch.autograd.Function]) -> Any:
    """``fn.apply`` without its Python preamble, which only serves ``torch.func`` transforms (they
    never reach here: :func:`fusable` refuses them) and ``setup_context`` Functions (not these).
    Measured: ~25-40 us less per call right after a kernel has streamed the caches cold.
    """
    return super(torch.autograd.Function, fn).apply  # type: ignore[misc]


def _embedding_forward(weight: torch.Tensor, table: torch.Tensor | None, ids: torch.Tensor,
                       pos: Positions, scale: float, p: float, seed: int) -> torch.Tensor:
    out = embedding_forward(_np(weight), ids.numpy(), scale=scale,
                            pos_table=None if table is None else _np(table),
                            pos_ids=_pos_np(pos), dropout_p=p, seed=seed)
    return torch.from_numpy(out)


_EMBEDDING_APPLY = _direct_apply(_Embedding)


def embedding(weight: torch.Tensor, ids: torch.Tensor, *, scale: float = 1.0, table: torch.Tensor | None = None,
              pos: Positions = None, dropout_p: float = 0.0, seed: int = 0,
              padding_idx: int | None = None) -> torch.Tensor:
    """``dropout(weight[ids] * scale + table[pos])`` on CPU through the fused kernel: (...) -> (..., D).

    ``ids`` is a checked CPU integer tensor, ``pos`` checked CPU integer positions (a tensor or a
    NumPy array that nobody writes; the ids' shape or a trailing part); ``table`` has the weight's
    dtype. Gradients reach ``weight`` (dense; ``padding_idx`` gets none) and ``table`` when they
    require grad and grad mode is on.
    """
    if torch.is_grad_enabled() and (weight.requires_grad or (table is not None and table.requires_grad)):
        return _EMBEDDING_APPLY(weight, table, ids, pos, scale, dropout_p, seed, padding_idx)
    return _embedding_forward(weight, table, ids, pos, scale, dropout_p, seed)


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
