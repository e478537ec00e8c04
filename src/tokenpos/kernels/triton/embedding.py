"""Fused embedding forward (gather * scale + positional row, counter-hash dropout) and its row-sparse backward.

Shapes: V vocab, D model dim, P positional rows, N = number of ids (any shape (...)), Np = pos.numel().
Row n of the flattened ids uses positional row ``pos[n % Np]`` (pos has the ids' shape or a trailing part).

Forward, per element (n, d), in fp32 whatever the weight dtype, rounded once to the weight dtype:

    y = (w[ids[n], d] * scale + table[pos[n % Np], d]) * m(offset + n * D + d)

with m the dropout multiplier of :mod:`._hash` (1/(1-p) if kept else 0: a multiply, so NaN/Inf propagate).
Launches run with ``enable_fp_fusion=False`` so the GPU rounds the product and the sum separately,
exactly like the NumPy reference (an FMA would differ in the last bit).

Backward: ids are sorted once (stable ``torch.sort``) and ``searchsorted`` gives every row v its segment
of the sorted order; one program per (v, block of D) sums its segment's gradient rows in fp32,
SEGMENT_ROWS rows per step (a fixed order: the result is deterministic), and writes row v once: no
atomics and no scatter into a zero-filled table. The positional gradient is the same kernel keyed by
``pos[n % Np]``. The ops layer validates ids and positions; the kernels still mask every load, so
an id outside [0, V) reads zeros instead of foreign memory.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS, round_to
from tokenpos.kernels.triton._grid import cdiv, next_power_of_2
from tokenpos.kernels.triton._hash import dropout_args, dropout_key, dropout_multiplier_tile, seed_tensor
from tokenpos.tables.errors import ConfigError

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_N = 16          # forward: ids per program
MAX_IDS = 2**31 - 1 - BLOCK_N   # forward: ids per call (row indices in int32; element offsets in int64)
SEGMENT_ROWS = 8      # backward: gradient rows loaded per step, so a frequent id's long segment is not a serial chain
SEGMENT_BLOCK_D = 2048   # backward: columns per program, and its warps (measured on an H100: 1.47x faster
SEGMENT_WARPS = 8        # than 512 columns and 4 warps, benchmarks/HISTORY.md, GPU 2026-11-23)


@triton.jit
def _embedding_forward_kernel(w_ptr, ids_ptr, t_ptr, pos_ptr, seed_ptr, out_ptr,
                              N, D, V, P, NPOS, stride_w, stride_t, scale, inv_keep, threshold, offset,
                              HAS_POS: tl.constexpr, HAS_DROPOUT: tl.constexpr, PAIRS: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows32 = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)                # (BN,) int32: N < 2**31 - BLOCK_N
    rows = rows32.to(tl.int64)                                                  # element offsets can pass 2**31
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)                   # (BD,)
    rmask = rows32 < N
    cmask = cols < D
    ids = tl.load(ids_ptr + rows32, mask=rmask, other=0).to(tl.int64)
    ok = rmask & (ids >= 0) & (ids < V)
    w = tl.load(w_ptr + ids[:, None] * stride_w + cols[None, :],
                mask=ok[:, None] & cmask[None, :], other=0.0).to(tl.float32)  # (BN, BD)
    y = w * scale
    if HAS_POS:
        pid = tl.load(pos_ptr + rows32 % NPOS, mask=rmask, other=0).to(tl.int64)   # int32 modulo
        pok = rmask & (pid >= 0) & (pid < P)
        t = tl.load(t_ptr + pid[:, None] * stride_t + cols[None, :],
                    mask=pok[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        y = y + t
    flat = rows[:, None] * D + cols[None, :]                                   # (BN, BD) int64
    if HAS_DROPOUT:
        y = y * dropout_multiplier_tile(dropout_key(seed_ptr), flat + offset, threshold, inv_keep,
                                        BLOCK_N, BLOCK_D, PAIRS)
    tl.store(out_ptr + flat, round_to(y, out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _segment_sum_kernel(grad_ptr, perm_ptr, bounds_ptr, seed_ptr, out_ptr,
                        D, scale, inv_keep, threshold, offset, skip_row,
                        HAS_DROPOUT: tl.constexpr, PAIRS: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    v = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)                   # (BD,)
    cmask = cols < D
    start = tl.load(bounds_ptr + v)
    end = tl.load(bounds_ptr + v + 1)
    end = tl.where(v == skip_row, start, end)                                   # padding row: no gradient
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_DROPOUT:
        key = dropout_key(seed_ptr)
    for j0 in range(start, end, ROWS):                                          # ROWS gradient rows per step
        js = j0 + tl.arange(0, ROWS)
        jm = js < end
        n = tl.load(perm_ptr + js, mask=jm, other=0).to(tl.int64)              # (ROWS,) original rows of this id
        off = n[:, None] * D + cols[None, :]                                    # (ROWS, BD)
        g = tl.load(grad_ptr + off, mask=jm[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        if HAS_DROPOUT:
            g = g * dropout_multiplier_tile(key, off + offset, threshold, inv_keep, ROWS, BLOCK_D, PAIRS)
        acc = acc + tl.sum(g, axis=0)
    acc = acc * scale
    tl.store(out_ptr + v.to(tl.int64) * D + cols, round_to(acc, out_ptr.dtype.element_ty), mask=cmask)


def _block_d(D: int, cap: int) -> int:
    return min(next_power_of_2(max(D, 1)), cap)


def _pairs(D: int, offset: int, block_d: int) -> bool:
    """Whether every tile row's dropout counters start even (D and offset even), so the kernels can
    hash pairs of counters (:func:`._hash.dropout_multiplier_tile`)."""
    return D % 2 == 0 and int(offset) % 2 == 0 and block_d >= 2


def _check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def _flat_pos(pos: torch.Tensor, ids_shape: torch.Size) -> torch.Tensor:
    """pos (...) flattened; its shape must be the ids' shape or a trailing part of it."""
    if pos.dim() > len(ids_shape) or tuple(pos.shape) != tuple(ids_shape)[len(ids_shape) - pos.dim():]:
        raise ConfigError(f"pos must have the ids' shape {tuple(ids_shape)} or a trailing part of it, "
                          f"got {tuple(pos.shape)}")
    return pos.reshape(-1).contiguous()


def embedding_forward(weight: torch.Tensor, ids: torch.Tensor, table: torch.Tensor | None,
                      pos: torch.Tensor | None, scale: float, p: float, seed: Any, *,
                      offset: int = 0) -> torch.Tensor:
    """Fused ``(weight[ids] * scale + table[pos]) * m`` in one launch.

    Args:
        weight: (V, D) float32 / float16 / bfloat16, unit stride along D.
        ids: (...) int32 or int64 token ids in [0, V) (validated by the caller).
        table: (P, D) float positional table (widened to fp32 per element), or None together with pos.
        pos: (...) or a trailing part of the ids' shape, ints in [0, P); row n uses ``pos[n % pos.numel()]``.
        scale: Python float (applied as an fp32 constant).
        p: dropout probability in [0, 1]; 0 disables the hash.
        seed: 0-d int64 tensor (read on the device, no host sync) or a Python int.
        offset: dropout counter offset (element (n, d) uses counter ``offset + n * D + d``).

    Returns:
        (..., D) tensor of ``weight.dtype`` on the weight's device.
    """
    _check_float("weight", weight)
    if weight.dim() != 2:
        raise ConfigError(f"weight must have shape (V, D), got {tuple(weight.shape)}")
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    V, D = weight.shape
    N = ids.numel()
    if N > MAX_IDS:
        raise ConfigError(f"at most {MAX_IDS} ids per call (the kernel indexes rows in int32), got {N}")
    flat_ids = ids.reshape(-1).contiguous()                                     # (N,)
    out = torch.empty((*ids.shape, D), dtype=weight.dtype, device=weight.device)
    if (table is None) != (pos is None):
        raise ConfigError("table and pos go together: pass both (a positional add) or neither, got "
                          f"table={'None' if table is None else tuple(table.shape)}, "
                          f"pos={'None' if pos is None else tuple(pos.shape)}")
    has_pos = table is not None and pos is not None
    if table is not None and pos is not None:
        if table.dim() != 2 or table.shape[1] != D:
            raise ConfigError(f"table must have shape (P, {D}), got {tuple(table.shape)}")
        tab = table if table.stride(1) == 1 else table.contiguous()
        flat_pos = _flat_pos(pos, ids.shape)
        P, npos = tab.shape[0], max(flat_pos.numel(), 1)
    else:                                                                       # unused by the kernel
        tab, flat_pos, P, npos = weight, flat_ids, 0, 1
    threshold, inv_keep = dropout_args(p)
    if N == 0 or D == 0:
        return out
    block_d = _block_d(D, 256)                                                  # tiles of <= 16 x 256 elements
    grid = (cdiv(N, BLOCK_N), cdiv(D, block_d))
    _embedding_forward_kernel[grid](
        weight, flat_ids, tab, flat_pos, seed_tensor(seed, weight.device), out,
        N, D, V, P, npos, weight.stride(0), tab.stride(0), float(scale), inv_keep, threshold, int(offset),
        HAS_POS=has_pos, HAS_DROPOUT=p > 0.0, PAIRS=_pairs(D, offset, block_d), BLOCK_N=BLOCK_N, BLOCK_D=block_d,
        **LAUNCH_OPTIONS)
    return out


def _segment_sum(grad2d: torch.Tensor, keys: torch.Tensor, num_rows: int, scale: float, p: float,
                 seed: torch.Tensor, skip_row: int, offset: int) -> torch.Tensor:
    """(num_rows, D) sums of ``grad2d`` rows grouped by ``keys`` (N,), each row written once."""
    N, D = grad2d.shape
    sorted_keys, perm = torch.sort(keys.to(torch.int64), stable=True)          # (N,), (N,)
    bounds = torch.searchsorted(sorted_keys, torch.arange(num_rows + 1, device=keys.device))   # (R+1,)
    out = torch.empty((num_rows, D), dtype=grad2d.dtype, device=grad2d.device)
    if num_rows == 0 or D == 0:
        return out
    threshold, inv_keep = dropout_args(p)
    block_d = _block_d(D, SEGMENT_BLOCK_D)                                      # tiles of ROWS x SEGMENT_BLOCK_D
    _segment_sum_kernel[(num_rows, cdiv(D, block_d))](
        grad2d, perm, bounds, seed, out, D, float(scale), inv_keep, threshold, int(offset), int(skip_row),
        HAS_DROPOUT=p > 0.0, PAIRS=_pairs(D, offset, block_d), BLOCK_D=block_d, ROWS=SEGMENT_ROWS,
        **{"num_warps": SEGMENT_WARPS, **LAUNCH_OPTIONS})
    return out


def embedding_backward(grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, num_weights: int,
                       num_positions: int, scale: float, p: float, seed: Any, padding_idx: int = -1, *,
                       offset: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`embedding_forward` with respect to ``weight`` and ``table``.

    Args:
        grad: (..., D) upstream gradient (float32 / float16 / bfloat16), the ids' shape plus D.
        ids, pos, scale, p, seed, offset: as given to the forward (the dropout mask is recomputed).
        num_weights: V. num_positions: P (ignored when ``pos`` is None).
        padding_idx: the row that gets no gradient, -1 for none.

    Returns:
        (grad_weight (V, D), grad_table (P, D) or None), in ``grad.dtype``, sums accumulated in fp32.
    """
    _check_float("grad", grad)
    D = grad.shape[-1]
    if tuple(grad.shape[:-1]) != tuple(ids.shape):
        raise ConfigError(f"grad must have shape {(*ids.shape, D)} (the ids' shape plus D), got {tuple(grad.shape)}")
    g2 = grad.reshape(-1, D).contiguous()                                       # (N, D)
    keys = ids.reshape(-1)                                                      # (N,)
    s = seed_tensor(seed, grad.device)
    grad_weight = _segment_sum(g2, keys, int(num_weights), scale, p, s, int(padding_idx), offset)
    if pos is None:
        return grad_weight, None
    flat_pos = _flat_pos(pos, ids.shape)
    npos = max(flat_pos.numel(), 1)
    full = flat_pos.repeat(keys.numel() // npos) if flat_pos.numel() else keys  # (N,) row n -> pos[n % Np]
    grad_table = _segment_sum(g2, full, int(num_positions), 1.0, p, s, -1, offset)
    return grad_weight, grad_table
