"""Checks and messages of packed sequences (``cu_seqlens``), written once for both backends.

Shapes: N documents, T tokens. ``cu_seqlens`` (N + 1,) int32 / int64: 0, the cumulative document
lengths, T (flash-attn's varlen convention; Hugging Face's ``DataCollatorWithFlattening``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import INT64_MAX, check_int, check_positions, check_start_pos, index_array
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError

CU_SEQLENS_DTYPES = ("int32", "int64")


def cu_seqlens_dtype_message(dtype: Any) -> str:
    return f"cu_seqlens must be an int32 or int64 vector, got dtype {str(dtype).replace('torch.', '')}"


def cu_seqlens_shape_message(shape: tuple[int, ...]) -> str:
    return (f"cu_seqlens must have shape (num_docs + 1,): 0, the cumulative lengths, T; got shape "
            f"{tuple(int(s) for s in shape)}")


def cu_seqlens_device_message(device: Any, expected: Any) -> str:
    return f"cu_seqlens is on {device}, but the data is on {expected}; expected cu_seqlens on {expected}"


def cu_seqlens_device_check_message(total: int | None, device: Any) -> str:
    """The text of the device-side assert (the values are not read on the host)."""
    end = f", ending at T = {int(total)}" if total is not None else ""
    return (f"cu_seqlens on {device} invalid: expected 0 first, non-decreasing{end} (a device-side check; "
            "call tokenpos.set_device_checks(True) for a typed error with the index and the value, "
            "at one host sync per call)")


def packed_positions_given_message(what: str) -> str:
    return (f"{what} given together with cu_seqlens; the positions of a packed row come from cu_seqlens "
            f"(0, 1, ... in every document): pass one or the other")


def packed_batch_message(shape: tuple[int, ...], layout: str) -> str:
    return (f"a packed batch is one row: with cu_seqlens expected {layout}, got shape "
            f"{tuple(int(s) for s in shape)}")


def check_total(total: Any) -> int | None:
    """``total`` (T) None or an integer >= 0."""
    return None if total is None else check_int("total", total, minimum=0)


def check_cu_seqlens(cu_seqlens: Any, total: Any = None) -> np.ndarray:
    """``cu_seqlens`` checked -> (N + 1,) int64: int32 / int64, 1-D with at least one entry, 0 first,
    non-decreasing (empty documents are allowed), ending at ``total`` when it is given.

    Raises:
        DtypeError: not int32 / int64. ConfigError: not (N + 1,), or ``total`` not an int >= 0.
        PositionError: a value that breaks the rules, named with its index.
    """
    total = check_total(total)
    cu = index_array(cu_seqlens)
    if cu.dtype.name not in CU_SEQLENS_DTYPES:
        raise DtypeError(cu_seqlens_dtype_message(cu.dtype))
    if cu.ndim != 1 or cu.size < 1:
        raise ConfigError(cu_seqlens_shape_message(cu.shape))
    cu = cu.astype(np.int64, copy=False)
    if cu[0] != 0:
        raise PositionError(f"cu_seqlens[0] must be 0 (the first document starts there), got {int(cu[0])}")
    down = np.flatnonzero(cu[1:] < cu[:-1])
    if down.size:
        i = int(down[0]) + 1
        raise PositionError(f"cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {int(cu[i])} after "
                            f"cu_seqlens[{i - 1}] = {int(cu[i - 1])}")
    if total is not None and cu[-1] != total:
        raise PositionError(f"cu_seqlens must end at the number of tokens T = {total}, got "
                            f"cu_seqlens[-1] = {int(cu[-1])}")
    return cu


def document_starts_shape_message(shape: tuple[int, ...], num_docs: int) -> str:
    return (f"start_pos with cu_seqlens must be an int or one int per document, shape ({num_docs},); got shape "
            f"{tuple(int(s) for s in shape)}")


def check_document_starts(start_pos: Any, lengths: np.ndarray) -> np.ndarray:
    """Where each of N documents starts counting (flash-attn's ``seqlen_offsets``): ``start_pos`` an int >= 0
    (every document; a 0-d array too) or N ints >= 0, one per document, for documents of ``lengths`` (N,) int64
    -> (N,) int64.

    Raises:
        ConfigError: not an int or (N,); PositionError: a negative or non-integer value, or a document whose
            last position would pass 2**63 - 1.
    """
    n = lengths.shape[0]
    if isinstance(start_pos, (int, np.integer)) and not isinstance(start_pos, bool):
        return np.full(n, check_start_pos(start_pos, int(lengths.max(initial=0))), dtype=np.int64)
    starts = check_positions(start_pos, what="start_pos")
    if starts.ndim == 0:                                  # a 0-d array or tensor: one start for every document
        starts = np.full(n, starts, dtype=np.int64)
    if starts.shape != (n,):
        raise ConfigError(document_starts_shape_message(starts.shape, n))
    over = np.flatnonzero(starts > INT64_MAX - lengths)
    if over.size:
        d = int(over[0])
        raise PositionError(f"start_pos {int(starts[d])} of document {d} with its {int(lengths[d])} tokens overflows "
                            f"int64; expected start_pos + length <= {INT64_MAX}")
    return starts


def check_restarting_positions(positions: np.ndarray) -> None:
    """Positions (T,) int64 of a packed row: 0 first, then each one either the previous + 1 or 0 (a new
    document). Raises PositionError naming the first one that breaks this."""
    if positions.size and positions[0] != 0:
        raise PositionError(f"positions of a packed row must start at 0, got positions[0] = {int(positions[0])}")
    bad = np.flatnonzero((positions[1:] != 0) & (positions[1:] != positions[:-1] + 1))
    if bad.size:
        i = int(bad[0]) + 1
        raise PositionError(f"positions of a packed row must count up by 1 or restart at 0, got positions[{i}] = "
                            f"{int(positions[i])} after positions[{i - 1}] = {int(positions[i - 1])}")


def check_packed_embedding_args(ids_shape: tuple[int, ...], positions: Any, position_ids: str) -> int:
    """What ``TransformerEmbedding.forward(ids, ..., cu_seqlens=...)`` needs besides ``cu_seqlens``: ids
    (T,) or (1, T), no positions (they come from cu_seqlens; ``start_pos``, where each document starts,
    is checked with them), default position ids (RoBERTa's come from the padding). Returns T. Raises
    ConfigError."""
    if len(ids_shape) == 2 and ids_shape[0] != 1:
        raise ConfigError(packed_batch_message(ids_shape, "ids of shape (T,) or (1, T)"))
    if positions is not None:
        raise ConfigError(packed_positions_given_message("positions"))
    if position_ids != "default":
        raise ConfigError(f"position_ids={position_ids!r} derives the positions from the ids; with cu_seqlens "
                          f"they come from the documents: expected position_ids='default'")
    return int(ids_shape[-1])


def _check_no_positions(positions: Any, key_positions: Any) -> None:
    """With cu_seqlens the positions come from it: none given, no key_positions."""
    for name, value in (("positions", positions), ("key_positions", key_positions)):
        if value is not None:
            raise ConfigError(packed_positions_given_message(name))


def check_packed_rotary_args(bhld_shape: tuple[int, ...], positions: Any, key_positions: Any) -> int:
    """What a rotary ``apply(q, k, cu_seqlens=...)`` needs besides ``cu_seqlens``: one row (q as (1, H, T,
    Dh) once in (B, H, L, Dh); always so with ``qk_layout="thd"``), no positions or key_positions (the
    positions come from cu_seqlens; ``start_pos``, where each document starts, is checked with them).
    Returns T. Raises ConfigError."""
    if bhld_shape[0] != 1:
        raise ConfigError(packed_batch_message(bhld_shape, "q of shape (T, H, Dh) (qk_layout='thd') or "
                                                           "(1, H, T, Dh) as (B, H, L, Dh)"))
    _check_no_positions(positions, key_positions)
    return int(bhld_shape[2])


def check_packed_attention_args(q_shape: tuple[int, ...], k_shape: tuple[int, ...], positions: Any, start_pos: Any,
                                key_positions: Any, given: tuple[tuple[int, ...], tuple[int, ...]] | None = None
                                ) -> int:
    """What ``scaled_dot_product_attention(q, k, v, cu_seqlens=...)`` needs besides ``cu_seqlens``: q, k
    as (1, H, T, Dh) (one packed row, queries and keys the same T tokens: no KV cache), no positions,
    key_positions or start_pos (they come from cu_seqlens). ``given``: q's and k's shapes as the caller passed
    them (what the error quotes; default the (B, H, L, Dh) ones). Returns T. Raises ConfigError."""
    if q_shape[0] != 1 or q_shape[2] != k_shape[2]:
        shown_q, shown_k = given if given is not None else (q_shape, k_shape)
        raise ConfigError(f"with cu_seqlens q, k and v are one packed row of the same T tokens, (T, H, Dh) or "
                          f"(1, H, T, Dh); got q {tuple(int(s) for s in shown_q)} and k "
                          f"{tuple(int(s) for s in shown_k)}")
    _check_no_positions(positions, key_positions)
    if start_pos is not None and (not isinstance(start_pos, (int, np.integer)) or start_pos != 0):
        raise ConfigError(f"start_pos={start_pos!r} given together with cu_seqlens; packed attention runs over "
                          f"the same T tokens as queries and keys (no KV cache), so the positions restart at 0 "
                          f"in every document: pass start_pos 0 or None")
    return int(q_shape[2])
