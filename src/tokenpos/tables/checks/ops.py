"""The argument checks of the fused ops (``torch.ops.tokenpos.*`` and the NumPy kernel API), and their messages.

Every implementation of an op (the numba kernel, the Triton kernel, plain torch, the fake / meta one)
runs these checks first, so whether the kernels are on, which device and which dtype never changes
whether a call is refused or what it says. They read only shapes, dtypes and Python scalars (no
tensor values: no ``.item()``, no device sync); the values of ids and positions are the layers' to
check (``torch/_checks.py``, ``checks.validation``).

Arguments are duck-typed: anything with ``.shape`` and ``.dtype`` (torch tensors, NumPy arrays,
fake tensors, functorch-wrapped tensors, whose shape is the per-sample one).

Shapes: B batch, H heads (Hk key heads), L length, Dh head dim, F = R/2 rotated pairs (R <= Dh), P table
rows (RoPE tables read by position);
V vocab, D model dim, P positions; ids (...) any shape, pos the ids' shape or a trailing part of it.
"""

from __future__ import annotations

from typing import Any

from tokenpos.tables.checks.rope import OP_LENGTH_ADVICE, rope_dtype_message, rope_length_message
from tokenpos.tables.checks.validation import (
    check_probability,
    float_dtype_message,
    position_dtype_message,
    token_id_dtype_message,
)
from tokenpos.tables.errors import ConfigError, DtypeError

FLOATS = frozenset(("float16", "bfloat16", "float32", "float64"))
TABLE_FLOATS = frozenset(("float32", "float64"))          # RoPE tables: never low precision
INTEGERS = frozenset(("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"))


def _name(dtype: Any) -> str:
    """'float32' for torch.float32 and np.dtype('float32') alike (no NumPy call: this runs per op call)."""
    return str(dtype).rpartition(".")[2]


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


# ----------------------------------------------------------------------------------------------
# Messages (the numba kernel API raises these too: kernels.rope, kernels.embedding)
# ----------------------------------------------------------------------------------------------


def rope_rank_message(name: str, shape: tuple[int, ...]) -> str:
    """``x must have shape (B, H, L, head_dim), got (2, 8, 64)``."""
    return f"{name} must have shape (B, H, L, head_dim), got {tuple(int(s) for s in shape)}"


def rope_tables_dtype_message(cos: Any, sin: Any) -> str:
    """cos and sin of a low-precision or integer dtype, or of different dtypes or shapes."""
    return (f"cos and sin must be float32/float64 arrays of one dtype and shape, got {_name(cos.dtype)} "
            f"{_shape(cos)} and {_name(sin.dtype)} {_shape(sin)}")


def rope_tables_shape_message(shape: tuple[int, ...], batch: int, length: int, head_dim: int) -> str:
    """cos / sin whose shape is not (L, F), (1, L, F) or (B, L, F) with 2F <= Dh."""
    return (f"cos/sin must have shape ({length}, R/2) or ({batch}, {length}, R/2) with R <= head_dim={head_dim}, "
            f"got {tuple(int(s) for s in shape)}")


def rope_indexed_tables_message(shape: tuple[int, ...], head_dim: int) -> str:
    """cos / sin read by position (``positions`` given) that are not one (P, F) table with 2F <= Dh."""
    return (f"cos/sin read by positions must have shape (P, R/2) with R <= head_dim={head_dim}, "
            f"got {tuple(int(s) for s in shape)}")


def rope_positions_shape_message(shape: tuple[int, ...], batch: int, length: int) -> str:
    """RoPE positions that are not (L,), (1, L) or (B, L)."""
    return (f"positions must have shape ({length},), (1, {length}) or ({batch}, {length}), "
            f"got {tuple(int(s) for s in shape)}")


def together_message(a: str, b: str) -> str:
    """``table and pos must be given together``."""
    return f"{a} and {b} must be given together"


def trailing_shape_message(name: str, ids_shape: tuple[int, ...], shape: tuple[int, ...]) -> str:
    return (f"{name} must have the ids' shape {tuple(int(s) for s in ids_shape)} or a trailing part of it, "
            f"got {tuple(int(s) for s in shape)}")


def table_shape_message(name: str, width: Any, shape: tuple[int, ...]) -> str:
    """``weight must have shape (V, D), got (3,)`` / ``table must have shape (P, 8), got (4, 6)``."""
    return f"{name} must have shape ({'V' if width is None else 'P'}, {'D' if width is None else width}), " \
           f"got {tuple(int(s) for s in shape)}"


def seed_message(seed: Any) -> str:
    return f"seed must be a 0-d int64 tensor, got {_name(seed.dtype)} of shape {_shape(seed)}"


def padding_idx_message(padding_idx: int, vocab_size: int) -> str:
    return f"padding_idx must be -1 (none) or in [0, {int(vocab_size)}), got {padding_idx}"


def count_message(name: str, value: int) -> str:
    return f"{name} must be >= 0, got {value}"


def grad_shape_message(ids_shape: tuple[int, ...], shape: tuple[int, ...]) -> str:
    return (f"grad must have shape ids.shape + (D,) = {tuple(int(s) for s in ids_shape)} + (D,), "
            f"got {tuple(int(s) for s in shape)}")


# ----------------------------------------------------------------------------------------------
# RoPE: tokenpos::rope, rope_qk (and their transposes)
# ----------------------------------------------------------------------------------------------


def check_rope_input(name: str, x: Any) -> None:
    """x (B, H, L, Dh) of a float dtype."""
    if len(x.shape) != 4:
        raise ConfigError(rope_rank_message(name, x.shape))
    if _name(x.dtype) not in FLOATS:
        raise DtypeError(rope_dtype_message(name, _name(x.dtype)))


def check_rope_tables(cos: Any, sin: Any, batch: int, length: int, head_dim: int) -> None:
    """cos / sin: one float32 / float64 dtype, one shape, (L, F), (1, L, F) or (B, L, F), 2F <= Dh."""
    c = cos.shape
    if _name(cos.dtype) not in TABLE_FLOATS or sin.dtype != cos.dtype or sin.shape != c:
        raise ConfigError(rope_tables_dtype_message(cos, sin))
    n = len(c)
    if not ((n == 2 or (n == 3 and c[0] in (1, batch))) and c[-2] == length and 2 * c[-1] <= head_dim):
        raise ConfigError(rope_tables_shape_message(c, batch, length, head_dim))


def check_rope_indexed_tables(cos: Any, sin: Any, positions: Any, batch: int, length: int, head_dim: int) -> None:
    """Tables read by position: cos / sin one (P, F) float32 / float64 table, 2F <= Dh; positions integer,
    (L,), (1, L) or (B, L). Their values (in [0, P)) are the caller's: shapes and dtypes only here."""
    c = cos.shape
    if _name(cos.dtype) not in TABLE_FLOATS or sin.dtype != cos.dtype or sin.shape != c:
        raise ConfigError(rope_tables_dtype_message(cos, sin))
    if len(c) != 2 or 2 * c[-1] > head_dim:
        raise ConfigError(rope_indexed_tables_message(c, head_dim))
    if _name(positions.dtype) not in INTEGERS:
        raise DtypeError(position_dtype_message(_name(positions.dtype)))
    p = _shape(positions)
    if not (p == (length,) or (len(p) == 2 and p[0] in (1, batch) and p[1] == length)):
        raise ConfigError(rope_positions_shape_message(p, batch, length))


def _check_tables(cos: Any, sin: Any, positions: Any, batch: int, length: int, head_dim: int) -> None:
    if positions is None:
        check_rope_tables(cos, sin, batch, length, head_dim)
    else:
        check_rope_indexed_tables(cos, sin, positions, batch, length, head_dim)


def check_rope_args(x: Any, cos: Any, sin: Any, positions: Any = None) -> None:
    """``tokenpos::rope``'s arguments: x (B, H, L, Dh) float, cos / sin as :func:`check_rope_tables`, or
    with ``positions`` as :func:`check_rope_indexed_tables`."""
    check_rope_input("x", x)
    B, _, L, Dh = x.shape
    _check_tables(cos, sin, positions, B, L, Dh)


def check_rope_qk_args(q: Any, k: Any, cos: Any, sin: Any, positions: Any = None) -> None:
    """``tokenpos::rope_qk``'s: q (B, H, L, Dh) and k (B, Hk, L, Dk) float (dtypes may differ), sharing B
    and L; cos / sin (and positions) fit q, and k's Dk holds the rotary dims too."""
    check_rope_input("q", q)
    check_rope_input("k", k)
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ConfigError(rope_length_message(_shape(q), _shape(k), OP_LENGTH_ADVICE))
    B, _, L, Dh = q.shape
    _check_tables(cos, sin, positions, B, L, min(Dh, k.shape[3]))


# ----------------------------------------------------------------------------------------------
# Embedding: tokenpos::embedding, embedding_backward
# ----------------------------------------------------------------------------------------------


def _check_ids_pos(ids: Any, pos: Any, vocab_size: int) -> None:
    if _name(ids.dtype) not in INTEGERS:
        raise DtypeError(token_id_dtype_message(_name(ids.dtype), vocab_size))
    if pos is not None:
        if _name(pos.dtype) not in INTEGERS:
            raise DtypeError(position_dtype_message(_name(pos.dtype)))
        n, s = len(pos.shape), ids.shape
        if n > len(s) or tuple(pos.shape) != tuple(s[len(s) - n:]):
            raise ConfigError(trailing_shape_message("pos", s, pos.shape))


def _check_dropout(p: Any, seed: Any, padding_idx: int, vocab_size: int) -> None:
    check_probability("p", p)
    if len(seed.shape) != 0 or _name(seed.dtype) != "int64":
        raise ConfigError(seed_message(seed))
    if padding_idx != -1 and not 0 <= padding_idx < vocab_size:
        raise ConfigError(padding_idx_message(padding_idx, vocab_size))


def check_embedding_args(weight: Any, ids: Any, table: Any, pos: Any, p: Any, seed: Any, padding_idx: int) -> None:
    """``tokenpos::embedding``'s arguments: weight (V, D) float; ids (...) integer; table (P, D) float and
    pos (integer, the ids' shape or a trailing part) both or neither; p in [0, 1) (as the layers'
    ``dropout``, ``checks.validation.check_probability``); seed 0-d int64; padding_idx -1 or in [0, V)."""
    if len(weight.shape) != 2:
        raise ConfigError(table_shape_message("weight", None, weight.shape))
    if _name(weight.dtype) not in FLOATS:
        raise DtypeError(float_dtype_message("weight", _name(weight.dtype)))
    if (table is None) != (pos is None):
        raise ConfigError(together_message("table", "pos"))
    if table is not None:
        if len(table.shape) != 2 or table.shape[1] != weight.shape[1]:
            raise ConfigError(table_shape_message("table", int(weight.shape[1]), table.shape))
        if _name(table.dtype) not in FLOATS:
            raise DtypeError(float_dtype_message("table", _name(table.dtype)))
    _check_ids_pos(ids, pos, weight.shape[0])
    _check_dropout(p, seed, padding_idx, weight.shape[0])


def check_embedding_backward_args(grad: Any, ids: Any, pos: Any, num_weights: int, num_positions: int, p: Any,
                                  seed: Any, padding_idx: int) -> None:
    """``tokenpos::embedding_backward``'s: grad (..., D) float with ids (...) integer; pos as the forward's
    (or None: no table gradient, zeros); num_weights, num_positions >= 0; p, seed, padding_idx as the
    forward's."""
    if _name(grad.dtype) not in FLOATS:
        raise DtypeError(float_dtype_message("grad", _name(grad.dtype)))
    if len(grad.shape) != len(ids.shape) + 1 or tuple(grad.shape[:-1]) != tuple(ids.shape):
        raise ConfigError(grad_shape_message(ids.shape, grad.shape))
    for name, value in (("num_weights", num_weights), ("num_positions", num_positions)):
        if value < 0:
            raise ConfigError(count_message(name, value))
    _check_ids_pos(ids, pos, num_weights)
    _check_dropout(p, seed, padding_idx, num_weights)
