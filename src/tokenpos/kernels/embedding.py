"""Fused embedding forward and its row-sparse backward.

Shapes: V vocab, D model dim, P positions, N = number of ids (any id shape ``(...)`` is flattened
to N rows in C order), U unique ids.

Forward, one pass over the output (one read of each gathered row, one write):

    y[n, :]   = weight[ids[n], :] * scale + pos_table[pos_ids[n], :]      (pos part optional)
    out[n, d] = y[n, d] * m[n, d],   m = 1 / (1 - p) if keep(seed, offset + n*D + d) else 0

``keep`` is :func:`tokenpos.tables.formulas.dropout.dropout_keep_mask`'s hash, bit for bit; the dropout is
a multiply, so NaN/Inf propagate as in ``torch.nn.Dropout``. Arithmetic is in the weight dtype, in
this order, with no fused multiply-add, so the kernel and its reference twin
(:mod:`tokenpos.kernels.reference`) agree bit for bit. bf16 tables (uint16 bits, ``bf16=True``)
are widened exactly to float32, computed in float32 and rounded once (:mod:`._forward`).
The compiled forward core lives in :mod:`._forward`; ``out=None`` takes a block from
:data:`tokenpos._config.OUTPUTS` (reused memory, no page faults; see :mod:`tokenpos._outputs`).

Backward recomputes the mask from the seed (nothing is stored) and returns the token gradient as
unique sorted ids plus summed rows, and the positional gradient as a dense (P, D) table. Sums are
accumulated in float64 and cast to the weight dtype at the end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tokenpos._config import OUTPUTS
from tokenpos.kernels._backward import _group, _segment_sum_core, _unique_inverse
from tokenpos.kernels._forward import forward_core, forward_core_serial
from tokenpos.kernels._launch import launch
from tokenpos.kernels._rng import dropout_params
from tokenpos.kernels._threading import parallel, parallel_guard
from tokenpos.tables.checks.validation import check_positions, check_probability, check_token_ids
from tokenpos.tables.errors import ConfigError, KernelBoundError, PositionError, TokenIdError

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_BITS16 = (np.dtype(np.uint16), np.dtype(np.int16))
PREFETCH_AHEAD = 2        # backward: gathered grad rows prefetched ahead into L1 (0 turns it off)
PREFETCH_FAR = 16         # ... and this far ahead into L2 (0 turns it off)
PARALLEL_BYTES = 1 << 18  # forward: smaller outputs (half with dropout) run on the calling thread
PREFETCH_BYTES = 12 << 10  # forward: the token row about this many table bytes on is prefetched into L1, a line
                          # per line computed (whole rows, at least one; 0 turns it off)
PREFETCH_L2_TIMES = 2     # ... and the row this many times as far on into L2 (0 turns it off)
_NO_DROPOUT = (np.uint64(0), np.uint64(0), 1.0)   # (seed bits, threshold, 1 / (1 - p)) for p = 0
_ONE_POSITION = np.zeros(1, np.int64)             # the unread positions of a call without a table
_ONE_POSITION.flags.writeable = False


# ----------------------------------------------------------------------------------------------
# argument preparation (shared with the reference twin)
# ----------------------------------------------------------------------------------------------


def _float_array(name: str, x: Any, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype not in _FLOATS:
        raise ConfigError(f"{name} must be float32 or float64, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ConfigError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def _flat_pos_ids(pos_ids: Any, ids_shape: tuple[int, ...], num_positions: int | None) -> np.ndarray:
    """Positions as a flat int64 array whose length divides N; row n uses ``pos[n % len(pos)]``.

    ``pos_ids`` has the ids' shape or a trailing part of it (``(L,)`` for ids ``(B, L)``); every
    value is checked against [0, num_positions).
    """
    pos = check_positions(pos_ids, num_positions)
    k = pos.ndim
    if k > len(ids_shape) or pos.shape != ids_shape[len(ids_shape) - k:]:
        raise ConfigError(
            f"pos_ids must have the ids' shape {tuple(ids_shape)} or a trailing part of it, got {pos.shape}"
        )
    flat = np.ascontiguousarray(pos.reshape(-1))
    if flat.size == 0 and math.prod(ids_shape) > 0:
        raise ConfigError("pos_ids is empty but ids are not")
    return flat if flat.size else np.zeros(1, np.int64)


def _unique_ids(flat_ids: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique ids without ``pad``, slot of each id or -1): O(N + V) marks, or a sort when
    the largest id is far beyond N (no V-sized table for a stray huge id)."""
    N = flat_ids.shape[0]
    if N == 0:
        return np.zeros(0, np.int64), flat_ids
    if int(flat_ids.max()) < max(1 << 22, 16 * N):
        return _unique_inverse(flat_ids, pad)
    uniq, inverse = np.unique(flat_ids, return_inverse=True)
    keep = uniq != pad
    slot = np.cumsum(keep) - 1
    slot[~keep] = -1
    return uniq[keep].astype(np.int64), slot[inverse.reshape(-1)].astype(np.int64)


def _table(name: str, x: Any, bf16: bool) -> np.ndarray:
    """A 2-D float32/float64 table, or (``bf16``) a 2-D table of bf16 bits viewed as uint16."""
    if not bf16:
        return _float_array(name, x, 2)
    arr = np.asarray(x)
    if arr.dtype not in _BITS16:
        raise ConfigError(f"{name} must hold bf16 bits as uint16 or int16 when bf16=True, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ConfigError(f"{name} must have 2 dimensions, got shape {arr.shape}")
    return np.ascontiguousarray(arr).view(np.uint16)


def prepare_forward(weight: Any, ids: Any, pos_table: Any, pos_ids: Any, dropout_p: float, *,
                    bf16: bool = False):
    """Validate and normalise forward arguments (the checked kernel API's one check); returns
    (weight, ids (...) int64, pos table, flat pos ids, p)."""
    w = _table("weight", weight, bf16)
    idx = check_token_ids(ids, w.shape[0])
    p = check_probability("dropout_p", dropout_p)
    if (pos_table is None) != (pos_ids is None):
        raise ConfigError("pos_table and pos_ids must be given together")
    if pos_table is not None:
        pt = _table("pos_table", pos_table, bf16)
        if pt.shape[1] != w.shape[1]:
            raise ConfigError(f"pos_table must have shape (P, {w.shape[1]}), got {pt.shape}")
        pt = np.ascontiguousarray(pt, dtype=w.dtype)
        pid = _flat_pos_ids(pos_ids, idx.shape, pt.shape[0])
    else:
        pt, pid = None, None
    return w, idx, pt, pid, p


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, bf16: bool) -> np.ndarray:
    """The caller's ``out=`` (returned as given) after checking it; bf16 accepts uint16 or int16 bits."""
    ok_dtype = (out.dtype in _BITS16) if (bf16 and isinstance(out, np.ndarray)) else (
        getattr(out, "dtype", None) == dtype)
    if (not isinstance(out, np.ndarray) or out.shape != shape or not ok_dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ConfigError(f"out must be a writeable C-contiguous {'bf16-bits' if bf16 else dtype} array of "
                          f"shape {shape}, got {getattr(out, 'dtype', type(out).__name__)} "
                          f"{getattr(out, 'shape', '')}")
    return out


# ----------------------------------------------------------------------------------------------
# public kernels
# ----------------------------------------------------------------------------------------------


def embedding_forward(weight: Any, ids: Any, *, scale: float = 1.0, pos_table: Any = None,
                      pos_ids: Any = None, dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
                      out: np.ndarray | None = None, bf16: bool = False) -> np.ndarray:
    """Gather + scale + positional add + dropout in one pass: the checked kernel API.

    Args:
        weight: (V, D) float32 or float64 token table; with ``bf16=True`` a (V, D) uint16 (or
            int16) array of bf16 bits (``tensor.view(torch.int16).numpy()``).
        ids: integer ids of any shape (...), each in [0, V) (checked: TokenIdError).
        scale: multiplies the gathered rows (sqrt(D) for scaled embeddings), in the weight dtype
            (float32 for bf16; never rounded to bf16).
        pos_table: optional (P, D) table (learned or sinusoidal); cast to the weight dtype if it is
            not already (pass it in the weight dtype to avoid a copy per call). bf16: uint16 bits.
        pos_ids: positions of the ids' shape, or of a trailing part of it ((L,) for ids (B, L)),
            each in [0, P) (checked: PositionError).
        dropout_p: drop probability in [0, 1); 0 means no dropout. Dropped elements are
            multiplied by 0 (NaN/Inf stay NaN), kept ones by ``1 / (1 - p)``.
        seed: the 63-bit dropout seed; element (n, d) of the flattened output uses counter
            ``dropout_offset + n*D + d``.
        out: optional preallocated C-contiguous (..., D) array of the weight dtype (bf16: uint16
            or int16 bits); it is returned. A zero-copy ``.numpy()`` view of a torch tensor
            works. Without it a new array is returned (from :data:`tokenpos._config.OUTPUTS`).
        bf16: weight, pos_table and out are bf16 bits; computed in float32 and rounded once to
            bf16 (round to nearest even), see :mod:`._forward`.

    Returns:
        (..., D) array of the weight dtype (bf16: uint16 bits, or ``out`` as given).
    """
    w, idx, pt, pid, p = prepare_forward(weight, ids, pos_table, pos_ids, dropout_p, bf16=bf16)
    D = w.shape[1]
    shape = idx.shape + (D,)
    out = OUTPUTS.empty(shape, w.dtype) if out is None else check_out(out, shape, w.dtype, bf16)
    forward_rows(w, idx, pt, pid, scale, p, seed, out.view(np.uint16) if bf16 else out, offset=dropout_offset)
    return out


def forward_rows(w: np.ndarray, ids: np.ndarray, pt: np.ndarray | None, pos: np.ndarray | None, scale: float,
                 p: float, seed: int, out: np.ndarray, *, offset: int = 0) -> np.ndarray:
    """:func:`embedding_forward` on checked inputs: the one entry to the compiled core, which both
    backends' ops and the checked API call.

    w (V, D) float32 / float64 (uint16: bf16 bits), ids (...) integer in [0, V), pt (P, D) of w's
    dtype with pos (the ids' shape or a trailing part) in [0, P), or both None; out (..., D) C-contiguous
    of w's dtype (uint16 bits for bf16), returned; ``offset`` as in
    :func:`embedding_forward`. Nothing is validated here, only the layout normalised; outputs under
    :data:`PARALLEL_BYTES` of work run on the calling thread. The core still bounds every row (its
    memory safety): rows it skipped for a bad id or position raise ``KernelBoundError``.
    """
    N, D = ids.size, w.shape[1]
    if not (N and D):
        return out
    typ = np.float32 if w.dtype == np.uint16 else w.dtype.type          # bf16 bits compute in float32
    bits, thr, inv = dropout_params(seed, p) if p else _NO_DROPOUT
    has_pos = pt is not None and pos is not None
    if not has_pos:
        pt, pos = w[:1], _ONE_POSITION                                    # never read (has_pos False)
    rows = out.reshape(N, D)
    args = (np.ascontiguousarray(w), np.ascontiguousarray(ids, dtype=np.int64).reshape(-1), typ(scale),
            np.ascontiguousarray(pt), np.ascontiguousarray(pos, dtype=np.int64).reshape(-1), has_pos,
            bits, thr, typ(inv), np.uint64(offset), *prefetch_rows(D * w.itemsize), rows)
    if out.nbytes * (2 if p else 1) < PARALLEL_BYTES:              # the dropout hash: about twice the work
        skipped = forward_core_serial(*args)
    else:
        with parallel_guard():
            skipped = parallel(forward_core, forward_core_serial)(*args)
    if skipped:
        raise bound_error(ids, w.shape[0], pt.shape[0] if has_pos else None, pos, skipped)  # type: ignore[union-attr]
    return out


def bound_error(ids: np.ndarray, vocab_size: int, num_positions: int | None, pos: np.ndarray | None,
                skipped: int | None) -> KernelBoundError:
    """The error of a gather that met an id outside [0, V) or a position outside [0, P) (``num_positions``
    None: no table): what the shared checks (the layers' own) say of the first one, then what the gather
    did (``skipped`` rows: the kernel; None: torch's gather, which refused the call). The error path only."""
    what = "an id or position outside its table"
    try:
        check_token_ids(ids, vocab_size)
        if num_positions is not None and pos is not None:
            check_positions(pos, num_positions)
    except (TokenIdError, PositionError) as err:
        what = str(err)
    done = ("the embedding gather refused the call" if skipped is None else
            f"the embedding kernel skipped {skipped} rows whose id or position lies outside its table")
    return KernelBoundError(f"{what}: {done} (tokenpos layers name the first bad value at their entry; in a "
                            f"graph traced by torch.compile, which cannot read values, the gather finds them)")


def prefetch_rows(row_bytes: int) -> tuple[int, int]:
    """How many rows on the forward prefetches, ``(into L1, into L2)``: :data:`PREFETCH_BYTES` of
    table rows of ``row_bytes`` each (at least 1; 0 when it is off), and :data:`PREFETCH_L2_TIMES` times
    that (0 when either is off). A distance in bytes, not rows, keeps about the same time between a
    prefetch and its use for every row width (measured: benchmarks/HISTORY.md, 2026-11-25)."""
    near = max(1, PREFETCH_BYTES // max(1, row_bytes)) if PREFETCH_BYTES > 0 else 0
    return near, near * max(0, PREFETCH_L2_TIMES)


def embedding_backward(grad_out: Any, ids: Any, *, scale: float = 1.0, dropout_p: float = 0.0, seed: int = 0,
                       dropout_offset: int = 0, padding_idx: int | None = None, pos_ids: Any = None,
                       num_positions: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Row-sparse gradient of :func:`embedding_forward` (the mask is recomputed from ``seed``).

    Args:
        grad_out: (..., D) gradient of the output; its dtype is the result dtype.
        ids: the forward's ids, shape (...).
        scale, dropout_p, seed, dropout_offset: the forward's values.
        padding_idx: that id receives no gradient (left out of the unique ids).
        pos_ids, num_positions: the forward's positions and the table size P; give both to get
            the positional gradient.

    Returns:
        ``(unique_ids (U,) int64 sorted, rows (U, D), pos_grad (P, D) or None)`` where
        ``rows[j] = scale * sum of the masked, 1/(1-p)-scaled grad rows whose id is unique_ids[j]``
        and ``pos_grad[q]`` the same sum (without ``scale``) over rows at position q. Sums are
        accumulated in float64.
    """
    g = np.asarray(grad_out)
    if g.dtype not in _FLOATS:
        raise ConfigError(f"grad_out must be float32 or float64, got dtype {g.dtype}")
    idx = check_token_ids(ids, np.iinfo(np.int64).max)
    D = g.shape[-1] if g.ndim else 0
    if g.shape != idx.shape + (D,):
        raise ConfigError(f"grad_out must have shape ids.shape + (D,) = {idx.shape + (D,)}, got {g.shape}")
    p = check_probability("dropout_p", dropout_p)
    has_pos = pos_ids is not None
    if has_pos != (num_positions is not None):
        raise ConfigError("pos_ids and num_positions must be given together")
    flat_ids = np.ascontiguousarray(idx.reshape(-1))
    N = flat_ids.shape[0]
    g2 = np.ascontiguousarray(g.reshape(N, D))
    P = 0 if num_positions is None else int(num_positions)
    pid = _flat_pos_ids(pos_ids, idx.shape, P) if has_pos else np.zeros(1, np.int64)
    pad = -1 if padding_idx is None else int(padding_idx)
    uniq, inverse = _unique_ids(flat_ids, pad)
    bits, thr, inv = dropout_params(seed, p)
    off = np.uint64(int(dropout_offset))
    rows = np.empty((uniq.shape[0], D), g.dtype)
    if rows.size:
        starts, order = _group(inverse, uniq.shape[0], 0)
        with launch(uniq.shape[0], max_chunk=16):
            parallel(_segment_sum_core)(g2, order, starts, bits, thr, off, float(scale) * inv, PREFETCH_AHEAD,
                              PREFETCH_FAR, rows)
    pos_grad = None
    if has_pos:
        pos_grad = np.zeros((P, D), g.dtype)
        if N and D:
            starts, order = _group(pid, P, N)
            with launch(P, max_chunk=4):
                parallel(_segment_sum_core)(g2, order, starts, bits, thr, off, inv, PREFETCH_AHEAD, PREFETCH_FAR,
                                  pos_grad)
    return uniq, rows, pos_grad
