"""Rotary position embedding (RoPE) applied to q and k in one pass, and its backward.

Shapes: B batch, H query heads, Hk key heads (GQA: Hk may differ from H), L length, Dh head dim,
R rotary dim (even, <= Dh), P table rows. Inputs are (B, H, L, Dh) and (B, Hk, L, Dh). ``cos``/``sin``
are the caller's tables, float32 or float64, computed in high precision by the caller
(``tables.formulas.rope``), of shape (L, R/2) (every batch row at the same positions) or (B, L, R/2)
(per-row positions); or, with ``positions`` (L,) / (1, L) / (B, L) integers in [0, P), a (P, R/2)
table whose row ``positions[b, l]`` rotates token (b, l) (a cached table indexed by position: packed
documents, whose positions restart per document, read it with no per-call table).

Layouts (only the first R dims rotate; dims R..Dh-1 pass through unchanged):

- ``"half"`` (HF / GPT-NeoX ``rotate_half``): x1 = x[:R/2], x2 = x[R/2:R]
      out[:R/2] = x1*cos - x2*sin,   out[R/2:R] = x2*cos + x1*sin
- ``"interleaved"`` (GPT-J / Meta): pairs (2i, 2i+1)
      out[2i] = x[2i]*cos_i - x[2i+1]*sin_i,   out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i

Arithmetic is in ``result_type(x, cos)`` (float64 tables with float32 inputs compute in float64 and
round once on store). The rotation is orthogonal, so the backward is the same pass with ``-sin``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from tokenpos._config import OUTPUTS
from tokenpos.kernels._threading import parallel, parallel_guard
from tokenpos.tables.checks.ops import check_rope_indexed_tables, check_rope_tables, rope_rank_message
from tokenpos.tables.checks.validation import check_choice, check_positions
from tokenpos.tables.errors import ConfigError

LAYOUTS = ("half", "interleaved")
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
ROPE_TASK_BYTES = 1 << 18      # bytes of rows per parallel task
PARALLEL_BYTES = 1 << 18       # passes over fewer bytes of q and k run on the calling thread (one task at most)


@njit(inline="always", cache=True)
def _rotate_row(x, o, r, cos, sin, c, sign, interleaved, copy_tail):  # pragma: no cover - compiled
    """o[r] = row r of x rotated by table row c (module doc); dims R..Dh-1 copied when ``copy_tail``."""
    R2 = cos.shape[1]
    if interleaved:
        for i in range(R2):
            x0 = x[r, 2 * i]
            x1 = x[r, 2 * i + 1]
            ci = cos[c, i]
            si = sin[c, i] * sign
            o[r, 2 * i] = x0 * ci - x1 * si
            o[r, 2 * i + 1] = x1 * ci + x0 * si
    else:
        for i in range(R2):
            x1 = x[r, i]
            x2 = x[r, i + R2]
            ci = cos[c, i]
            si = sin[c, i] * sign
            o[r, i] = x1 * ci - x2 * si
            o[r, i + R2] = x2 * ci + x1 * si
    if copy_tail:
        for d in range(2 * R2, x.shape[1]):
            o[r, d] = x[r, d]


@njit(inline="always", cache=True)
def _rope_task(t, tq, q, k, H, Hk, L, cos, sin, pos, sign, interleaved, copy_tail, out_q, out_k, rows_per_task,
               paired, per_batch):  # pragma: no cover - compiled
    """Task ``t`` of :func:`_rope_core`: rows ``[r0, r1)`` of q (t < tq) or of k."""
    if t < tq:
        x = q
        o = out_q
        HL = H * L
        r0 = t * rows_per_task
        r1 = min(q.shape[0], r0 + rows_per_task)
    else:
        x = k
        o = out_k
        HL = Hk * L
        r0 = (t - tq) * rows_per_task
        r1 = min(k.shape[0], r0 + rows_per_task)
    both = paired and t < tq
    l = r0 % L                                           # position of row r0; no division per row
    cb = (r0 // HL) * L if per_batch else 0              # its batch's first table (or positions) row
    left = HL - r0 % HL                                  # rows of this batch from r0 on
    indexed = pos.shape[0] > 0
    for r in range(r0, r1):
        c = pos[cb + l] if indexed else cb + l
        _rotate_row(x, o, r, cos, sin, c, sign, interleaved, copy_tail)
        if both:
            _rotate_row(k, out_k, r, cos, sin, c, sign, interleaved, copy_tail)
        l += 1
        if l == L:                                       # next (batch, head) slab
            l = 0
        left -= 1
        if left == 0:                                    # next batch (a counter: L = 1 rows divide no more)
            left = HL
            if per_batch:
                cb += L


@njit(cache=True)
def _tasks(q, k, H, Hk, L, cos, pos, rows_per_task):  # pragma: no cover - compiled
    """(tq, tk, paired, per_batch): q's task count, k's (0 when k's rows ride with q's), and the layout flags
    (per_batch: one table row, or one position, per (batch, l) rather than per l)."""
    paired = Hk == H and k.shape[0] == q.shape[0]
    tq = (q.shape[0] + rows_per_task - 1) // rows_per_task
    tk = 0 if paired else (k.shape[0] + rows_per_task - 1) // rows_per_task
    return tq, tk, paired, (pos.shape[0] if pos.shape[0] > 0 else cos.shape[0]) > L


@njit(parallel=True, cache=True)
def _rope_core(q, k, H, Hk, L, cos, sin, pos, sign, interleaved, copy_tail, out_q, out_k,
               rows_per_task):  # pragma: no cover - compiled
    """q (B*H*L, Dh), k (B*Hk*L, Dh), cos/sin (Bc*L, R/2) or (P, R/2), pos (0,) or (Bp*L,) int64;
    parallel over tasks of consecutive rows.

    Row r of q belongs to batch b = r // (H*L) at l = r % L; its index is ``b * L + l`` when tables
    (or positions) are per batch row (Bc > 1, Bp > 1), else ``l``; it uses that table row, or with
    positions (pos non-empty) table row ``pos[index]``. Indexing is direct (no
    per-row array views: rows are only Dh elements long). When k has q's heads (Hk == H), row r of
    k has row r of q's table row, and a task rotates both (one pass over the tables, four memory
    streams: 10-20 % faster than separate tasks, benchmarks/HISTORY.md); else q's and k's rows are separate
    tasks.
    """
    tq, tk, paired, per_batch = _tasks(q, k, H, Hk, L, cos, pos, rows_per_task)
    for t in prange(tq + tk):
        _rope_task(t, tq, q, k, H, Hk, L, cos, sin, pos, sign, interleaved, copy_tail, out_q, out_k, rows_per_task,
                   paired, per_batch)


@njit(cache=True)
def _rope_core_serial(q, k, H, Hk, L, cos, sin, pos, sign, interleaved, copy_tail, out_q, out_k,
                      rows_per_task):  # pragma: no cover - compiled
    """:func:`_rope_core` on the calling thread, for passes under :data:`PARALLEL_BYTES` (a decode step):
    the same tasks in order, the same bits."""
    tq, tk, paired, per_batch = _tasks(q, k, H, Hk, L, cos, pos, rows_per_task)
    for t in range(tq + tk):
        _rope_task(t, tq, q, k, H, Hk, L, cos, sin, pos, sign, interleaved, copy_tail, out_q, out_k, rows_per_task,
                   paired, per_batch)


def _as_heads(name: str, x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype not in _FLOATS:
        raise ConfigError(f"{name} must be float32 or float64, got dtype {arr.dtype}")
    if arr.ndim != 4:
        raise ConfigError(rope_rank_message(name, arr.shape))
    return np.ascontiguousarray(arr)


NO_POSITIONS = np.zeros(0, dtype=np.int64)      # the cores' "no positions": table rows by l (and b)


def prepare_rope(q: Any, k: Any, cos: Any, sin: Any, layout: str, positions: Any = None):
    """Validate; returns (q, k or None, cos, sin, layout, positions): cos / sin (Bc, L, R/2), positions
    :data:`NO_POSITIONS`; or with ``positions`` (L,) / (1, L) / (B, L) in [0, P) (PositionError else), cos /
    sin (P, R/2) and the positions flat int64 (Bp * L,)."""
    check_choice("layout", layout, LAYOUTS)
    q = _as_heads("q", q)
    B, _, L, Dh = q.shape
    if k is not None:
        k = _as_heads("k", k)
        if k.dtype != q.dtype or k.shape[0] != B or k.shape[2:] != (L, Dh):
            raise ConfigError(f"k must be {q.dtype} of shape ({B}, Hk, {L}, {Dh}), got {k.dtype} {k.shape}")
    c = np.asarray(cos)
    s = np.asarray(sin)
    if positions is not None:
        pos = np.asarray(positions)
        check_rope_indexed_tables(c, s, pos, B, L, Dh)             # the ops' checks (tables.checks.ops)
        pos = np.ascontiguousarray(check_positions(pos, c.shape[0]).reshape(-1))   # values: in [0, P)
        return q, k, np.ascontiguousarray(c), np.ascontiguousarray(s), layout, pos
    check_rope_tables(c, s, B, L, Dh)
    if c.ndim == 2:
        c, s = c[None], s[None]
    return q, k, np.ascontiguousarray(c), np.ascontiguousarray(s), layout, NO_POSITIONS


def _out(name: str, out: Any, like: np.ndarray) -> np.ndarray:
    if out is None:
        return OUTPUTS.empty(like.shape, like.dtype)
    if (not isinstance(out, np.ndarray) or out.shape != like.shape or out.dtype != like.dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ConfigError(f"{name} must be a writeable C-contiguous {like.dtype} array of shape {like.shape}")
    return out


def _run(q, k, cos, sin, layout, sign, out_q, out_k, positions):
    q, k, c, s, layout, pos = prepare_rope(q, k, cos, sin, layout, positions)
    oq = _out("out_q", out_q, q)
    ok = None if k is None else _out("out_k", out_k, k)
    kk, okk = (k, ok) if k is not None else (q[:, :0], oq[:, :0])
    # in place (out is the input) needs no pass-through copy of dims R..Dh-1
    copy_tail = not (np.shares_memory(oq, q) and (k is None or np.shares_memory(okk, kk)))
    run_rope(q, kk, c, s, layout == "interleaved", sign, copy_tail, oq, okk, pos)
    return oq, ok


def run_rope(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, sign: float,
             copy_tail: bool, out_q: np.ndarray, out_k: np.ndarray, positions: np.ndarray = NO_POSITIONS) -> None:
    """The compiled pass on arrays already in shape (nothing is validated here): q (B, H, L, Dh) and
    k (B, Hk, L, Dh) C-contiguous of one float dtype (k may have Hk = 0), cos / sin (Bc, L, R/2)
    (or (L, R/2)) C-contiguous with Bc in (1, B) and R <= Dh, outputs C-contiguous like q and k. ``copy_tail``:
    write dims R..Dh-1 too (False only when the outputs are the inputs). ``positions``: empty, or the
    int64 positions (L,) / (Bp, L) (any shape of those sizes, C-contiguous) in [0, P) of a (P, R/2) table."""
    if not (q.size or k.size):
        return
    _, H, L, Dh = q.shape
    per_task = max(1, ROPE_TASK_BYTES // max(1, Dh * q.itemsize))
    rows = cos.size // cos.shape[-1] if cos.shape[-1] else math.prod(cos.shape[:-1])   # (no reshape(-1, 0))
    args = (q.reshape(-1, Dh), k.reshape(-1, Dh), H, k.shape[1], L, cos.reshape(rows, cos.shape[-1]),
            sin.reshape(rows, sin.shape[-1]), positions.reshape(-1),
            q.dtype.type(sign) if cos.dtype == q.dtype else float(sign),
            interleaved, copy_tail, out_q.reshape(-1, Dh), out_k.reshape(-1, Dh), per_task)
    if q.nbytes + k.nbytes < PARALLEL_BYTES:   # a parallel launch costs more than it gives
        _rope_core_serial(*args)
        return
    with parallel_guard():                     # the pool balances the tasks (no chunk size: benchmarks/HISTORY.md)
        parallel(_rope_core, _rope_core_serial)(*args)


def rope_apply(q: Any, k: Any, cos: Any, sin: Any, *, layout: str = "half", out_q: np.ndarray | None = None,
               out_k: np.ndarray | None = None, positions: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Rotate q (B, H, L, Dh) and k (B, Hk, L, Dh) in one parallel pass.

    Args:
        q, k: float32/float64 arrays (k may be None). Non-contiguous inputs are copied first.
        cos, sin: (L, R/2) or (B, L, R/2) tables; R = 2 * cos.shape[-1] is the rotary dim. With
            ``positions``: one (P, R/2) table, row ``positions[b, l]`` for token (b, l).
        positions: None, or integers (L,), (1, L) or (B, L) in [0, P) (else PositionError).
        layout: "half" or "interleaved" (see the module docstring).
        out_q, out_k: optional preallocated C-contiguous outputs (may be q and k themselves for an
            in-place rotation, or zero-copy ``.numpy()`` views of torch tensors).

    Returns:
        ``(q_rot, k_rot)`` of the input shapes and dtype (``k_rot`` is None when k is None).
    """
    return _run(q, k, cos, sin, layout, 1.0, out_q, out_k, positions)


def rope_apply_backward(grad_q: Any, grad_k: Any, cos: Any, sin: Any, *, layout: str = "half",
                        out_q: np.ndarray | None = None, out_k: np.ndarray | None = None, positions: Any = None
                        ) -> tuple[np.ndarray, np.ndarray | None]:
    """Gradient of :func:`rope_apply` w.r.t. q and k: the inverse (transpose) rotation of the grads."""
    return _run(grad_q, grad_k, cos, sin, layout, -1.0, out_q, out_k, positions)
