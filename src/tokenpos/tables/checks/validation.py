"""Every input check of tokenpos, and every error message, written once.

Both backends call these functions (the torch backend calls the message builders with values it
found on its tensors), so a bad input gives the same exception type and the same text everywhere.
Messages follow "what, got, expected".
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, StateDictError, TokenIdError

# ----------------------------------------------------------------------------------------------
# Message builders (used by the torch backend with values taken from tensors)
# ----------------------------------------------------------------------------------------------


def _index_str(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")" if len(index) != 1 else f"({int(index[0])},)"


def token_id_range_message(value: int, index: tuple[int, ...], vocab_size: int) -> str:
    """``token id 50257 at index (1, 3) is out of range [0, 50257)``."""
    return f"token id {int(value)} at index {_index_str(index)} is out of range [0, {int(vocab_size)})"


def token_id_dtype_message(dtype: Any, vocab_size: int) -> str:
    """``token ids must be integers, got dtype float32; ...`` (a NumPy or torch dtype, or its name)."""
    return (f"token ids must be integers, got dtype {dtype_name(dtype)}; expected an integer array with values in "
            f"[0, {int(vocab_size)})")


def position_range_message(value: int, index: tuple[int, ...], max_seq_len: int, what: str = "position") -> str:
    """``position 1024 at index (0, 5) is out of range [0, 1024) (max_seq_len=1024)``."""
    return (
        f"{what} {int(value)} at index {_index_str(index)} is out of range [0, {int(max_seq_len)}) "
        f"(max_seq_len={int(max_seq_len)})"
    )


def position_dtype_message(dtype: Any) -> str:
    """``positions must be integers, got dtype float32; ...`` (a NumPy or torch dtype, or its name)."""
    return f"positions must be integers, got dtype {dtype_name(dtype)}; expected a non-negative integer array"


def float_dtype_message(name: str, dtype: Any) -> str:
    """``q must be a floating-point array, got dtype int64; expected float16, bfloat16, float32 or float64``."""
    return (f"{name} must be a floating-point array, got dtype {dtype_name(dtype)}; expected float16, bfloat16, "
            f"float32 or float64")


def id_layout_message(what: str, layout: str) -> str:
    """Nested / sparse tensors of ids or positions (the torch backend finds the layout)."""
    return f"{what} must be a dense (strided) tensor, got a {layout} tensor; expected a plain integer tensor"


# ----------------------------------------------------------------------------------------------
# Scalar arguments
# ----------------------------------------------------------------------------------------------


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A Python/NumPy integer (not bool) in [``minimum``, ``maximum``]; returns it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {v}")
    return v


def check_positive_int(name: str, value: Any) -> int:
    """An integer > 0, e.g. vocab_size, d_model, max_seq_len, num_heads."""
    return check_int(name, value, minimum=1)


def check_float(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                low_inclusive: bool = True, high_inclusive: bool = True) -> float:
    """A finite real number inside the given bounds; returns it as ``float``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(float(value)):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    v = float(value)
    if low is not None and (v < low or (v == low and not low_inclusive)):
        bound = f"{'>=' if low_inclusive else '>'} {low}"
        raise ConfigError(f"{name} must be {bound}, got {v}")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        bound = f"{'<=' if high_inclusive else '<'} {high}"
        raise ConfigError(f"{name} must be {bound}, got {v}")
    return v


def check_bool(name: str, value: Any) -> bool:
    """A real bool (``True`` / ``False``, NumPy bools too); ``"yes"``, 1 or None are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


INT64_MAX = int(np.iinfo(np.int64).max)


def check_start_pos(start_pos: Any, length: int) -> int:
    """``start_pos`` >= 0 such that the positions ``start_pos + arange(length)`` fit in int64.

    Raises:
        ConfigError: not an integer, or negative.
        PositionError: ``start_pos + length`` beyond 2**63 - 1 (the positions would overflow int64).
    """
    start = start_pos if type(start_pos) is int and start_pos >= 0 else check_int("start_pos", start_pos, minimum=0)
    if start + int(length) > INT64_MAX:
        raise PositionError(f"start_pos {start} with {int(length)} positions overflows int64: the positions would "
                            f"run to {start + int(length) - 1}; expected start_pos + length <= {INT64_MAX}")
    return start


def check_start_pos_with_positions(start_pos: Any, positions: Any, *, none_ok: bool = False) -> None:
    """With ``positions`` given, ``start_pos`` must be 0 (or None where ``none_ok``: the functions whose
    default it is, e.g. the attention functions and 2-D RoPE): positions are used as given, so any
    other start_pos would be silently ignored. Nothing to check when ``positions`` is None.

    Both backends call this before any state changes (a dropout seed drawn, a backward cache kept).

    Raises:
        ConfigError: ``positions`` given with another ``start_pos`` (a nonzero integer, a bool, a
            float, a string, or None where None is not the default).
    """
    if positions is None or (type(start_pos) is int and start_pos == 0):     # the common calls, at once
        return
    if start_pos is None and none_ok:
        return
    integral = isinstance(start_pos, numbers.Integral) and not isinstance(start_pos, bool)
    if integral and int(start_pos) == 0:                                     # np.int64(0) and the like
        return
    got = int(start_pos) if integral else repr(start_pos)
    expected = "start_pos=None or 0" if none_ok else "start_pos=0"
    raise ConfigError(f"start_pos={got} given with positions: positions are used as given, so start_pos would "
                      f"be ignored; expected {expected} (add the offset to positions instead)")


def check_probability(name: str, value: Any) -> float:
    """A dropout probability in [0, 1)."""
    if type(value) is float and 0.0 <= value < 1.0:       # the common case, without the ABC checks
        return value
    return check_float(name, value, low=0.0, high=1.0, high_inclusive=False)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` must be one of ``choices``; the message lists them."""
    choices = list(choices)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{name} must be one of {listed}; got {value!r}")
    return value


def check_padding_idx(padding_idx: Any, vocab_size: int) -> int | None:
    """None, or an index in [0, vocab_size). Negative values are refused, not wrapped."""
    if padding_idx is None:
        return None
    idx = check_int("padding_idx", padding_idx)
    if not 0 <= idx < vocab_size:
        raise ConfigError(f"padding_idx must be in [0, {vocab_size}) or None, got {idx}")
    return idx


def check_dtype(name: str, dtype: Any, allowed: Sequence[Any] = (np.float16, np.float32, np.float64)) -> np.dtype:
    """A NumPy floating dtype among ``allowed``; None is the default, float32 (as torch's default dtype; NumPy
    would read None as float64)."""
    if dtype is None:
        dtype = np.float32
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ConfigError(f"{name} must be a NumPy dtype, got {dtype!r}") from exc
    allowed_dt = [np.dtype(a) for a in allowed]
    if dt not in allowed_dt:
        raise ConfigError(f"{name} must be one of {', '.join(str(a) for a in allowed_dt)}; got {dt}")
    return dt


# ----------------------------------------------------------------------------------------------
# Arrays of ids and positions
# ----------------------------------------------------------------------------------------------


def _is_int_dtype(dtype: np.dtype) -> bool:
    """Signed or unsigned integers only: bool, float, object, timedelta64 and datetime64 are not ids
    (``np.issubdtype(np.timedelta64, np.integer)`` is True, so the kind code is checked instead)."""
    return dtype.kind in "iu"


def check_float_array(name: str, x: Any) -> np.ndarray:
    """A float input (q, k, v, hidden states) as an array of a floating dtype; the one float-input check.

    Raises:
        DtypeError (a ConfigError and a TypeError): integer, bool, complex or object input, whose
            arithmetic with float32 cos/sin or softmax would silently give garbage.
    """
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise DtypeError(float_dtype_message(name, arr.dtype))
    return arr


def shape_message(name: str, want: Any, got: Any) -> str:
    """The one wording of a wrong shape, for the checks both backends raise on their own arrays:
    ``"{name} must have shape {want}, got {got}"`` (``want``: a shape or a phrase such as "(B, L) or (L,)";
    ``got``: any sequence of ints, written as a tuple)."""
    return f"{name} must have shape {want}, got {tuple(got)}"


def check_grad(name: str, grad: Any, shape: tuple[int | str, ...]) -> np.ndarray:
    """A gradient handed to a NumPy backward: a floating array of exactly ``shape``, the forward output's (a
    name such as "Lq": any size on that axis); the one check of every backward's incoming gradient.

    Raises:
        DtypeError: not floating point (an integer gradient would truncate dx, a complex one drop its
            imaginary part). ConfigError: another shape (broadcasting it would give a wrong gradient).
    """
    arr = check_float_array(name, grad)
    if arr.ndim != len(shape) or any(not isinstance(s, str) and s != a for s, a in zip(shape, arr.shape, strict=False)):
        want = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ConfigError(f"{name} must have shape {want}, got {tuple(arr.shape)}: the forward output's shape")
    return arr


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def index_array(x: Any) -> np.ndarray:
    """``np.asarray(x)`` for ids, positions, targets and ``cu_seqlens``: an empty Python sequence holds no
    values, so it is an empty int64 array (``np.asarray([])`` would be float64, and refused as not integers)."""
    arr = np.asarray(x)
    return arr.astype(np.int64) if arr.size == 0 and not isinstance(x, np.ndarray) else arr


def check_token_ids(ids: Any, vocab_size: int) -> np.ndarray:
    """Integer ids of any shape with every value in [0, vocab_size); returns them as int64 (the
    message quotes a bad value as given). The twin of the torch backend's ``check_token_id_tensor``.

    Raises:
        TokenIdError: non-integer dtype (floats, bools, objects), or a value out of range. Negative
            ids are refused (NumPy would silently wrap them to the end of the table).
    """
    arr = index_array(ids)
    if not _is_int_dtype(arr.dtype):
        raise TokenIdError(token_id_dtype_message(arr.dtype, vocab_size))
    if not all_in_range(arr, vocab_size):                          # two reductions; the mask only to raise
        index = _first_bad((arr < 0) | (arr >= vocab_size))
        raise TokenIdError(token_id_range_message(arr[index], index, vocab_size))
    return arr.astype(np.int64, copy=False)


def check_positions(positions: Any, max_seq_len: int | None = None, *, what: str = "position") -> np.ndarray:
    """Non-negative integer positions, each < ``max_seq_len`` when it is given; returns int64.

    Raises:
        PositionError: non-integer dtype, a negative position, or one >= max_seq_len.
    """
    arr = index_array(positions)
    if not _is_int_dtype(arr.dtype):
        raise PositionError(position_dtype_message(arr.dtype))
    if not all_in_range(arr, max_seq_len):                       # the masks below only to raise
        neg = arr < 0
        if neg.any():
            index = _first_bad(neg)
            raise PositionError(f"{what} {int(arr[index])} at index {_index_str(index)} is negative; "
                                f"expected positions >= 0")
        limit = INT64_MAX + 1 if max_seq_len is None else max_seq_len   # uint64 beyond int64 would wrap
        if max_seq_len is not None or arr.dtype == np.uint64:
            bad = arr >= limit
            if bad.any():
                index = _first_bad(bad)
                raise PositionError(position_range_message(arr[index], index, limit, what))
    return arr.astype(np.int64, copy=False)


def check_positions_at(positions: Any, shape: tuple[int, ...] | None, max_seq_len: int | None = None) -> None:
    """:func:`check_positions` on the positions as they are used: broadcast to ``shape``, so the index
    in the message is the one of the broadcast array. Positions used at an empty shape (a batch of
    0) are checked as they are: an out-of-range position is bad input whether or not a row uses it.

    Raises:
        PositionError: as :func:`check_positions`.
    """
    arr = index_array(positions)
    full = np.broadcast_to(arr, shape) if shape else arr
    check_positions(full if full.size else arr, max_seq_len)


def all_in_range(arr: np.ndarray, high: int | None = None) -> bool:
    """Whether every value of an integer array lies in [0, high) (``high`` None: any int64), as
    :func:`check_token_ids` and :func:`check_positions` require: two reductions, no temporary masks
    (uint64 values beyond int64 are out of range even without a bound)."""
    if not arr.size:
        return True
    if arr.min() < 0:
        return False
    if high is None and arr.dtype != np.uint64:
        return True
    return bool(arr.max() < (INT64_MAX + 1 if high is None else high))


def check_seq_len_or_positions(arg: Any, max_seq_len: int | None = None) -> np.ndarray:
    """``forward(seq_len_or_positions)``: an int L means arange(L); an array means those positions."""
    if isinstance(arg, numbers.Integral) and not isinstance(arg, bool):
        L = check_int("seq_len", arg, minimum=0)
        if max_seq_len is not None and L > max_seq_len:
            raise PositionError(f"seq_len {L} exceeds max_seq_len {max_seq_len}; positions must be < {max_seq_len}")
        return np.arange(L, dtype=np.int64)
    return check_positions(arg, max_seq_len)


def check_feature_dim(name: str, array_shape: tuple[int, ...], expected: int) -> None:
    """The last axis of an input must have size ``expected`` (e.g. d_model or head_dim)."""
    if len(array_shape) == 0 or array_shape[-1] != expected:
        raise ConfigError(f"{name} must have last dimension {expected}, got shape {tuple(array_shape)}")


# ----------------------------------------------------------------------------------------------
# state_dict
# ----------------------------------------------------------------------------------------------


def check_state_mapping(state: Any) -> None:
    """What a ``load_state_dict`` is handed must be a mapping of names to arrays (StateDictError otherwise, not
    the AttributeError of calling ``.items()`` on it)."""
    if not isinstance(state, Mapping):
        raise StateDictError(f"a state_dict must be a dict of arrays, got {type(state).__name__}")


def check_state_dict(state: dict[str, Any], expected: dict[str, tuple[tuple[int, ...], Any]], *,
                     strict: bool = True, layer: str = "layer") -> None:
    """Check every entry of ``state`` against ``expected[key] = (shape, dtype)`` before any write.

    Arrays may be NumPy arrays or anything with ``.shape`` and ``.dtype`` (torch tensors); dtypes are
    compared by name ("float32"), so a torch float32 tensor fits a NumPy float32 parameter.

    Raises:
        StateDictError: naming the key, the expected shape/dtype and what was given.
    """
    if strict:
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise StateDictError(
                f"state_dict for {layer} does not fit: missing keys {missing}, unexpected keys {unexpected}; "
                f"expected keys {sorted(expected)}"
            )
    for key, value in state.items():
        if key not in expected:
            continue
        shape, dtype = expected[key]
        got_shape = tuple(int(s) for s in (value.shape if hasattr(value, "shape") else np.shape(value)))
        if got_shape != tuple(shape):
            raise StateDictError(f"state_dict[{key!r}] for {layer} has shape {got_shape}, expected {tuple(shape)}")
        got_dtype = dtype_name(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
        if got_dtype != dtype_name(dtype):
            raise StateDictError(
                f"state_dict[{key!r}] for {layer} has dtype {got_dtype}, expected {dtype_name(dtype)}"
            )


NUMPY_HELD = "a dtype NumPy holds (float16, float32, float64, an integer or bool)"


def numpy_holds(name: str) -> bool:
    """Whether NumPy has the dtype called ``name`` ("float32": yes; "bfloat16", "float8_e4m3fn": no)."""
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


def numpy_dtype_message(what: str, key: str, dtype: str, expected: Any = None) -> str:
    """A tensor NumPy cannot hold (bfloat16, float8, ...): names it, its dtype and the expected dtype."""
    want = NUMPY_HELD if expected is None else dtype_name(expected)
    return (f"{what} {key!r} has dtype {dtype}, which the NumPy backend cannot hold; expected {want} "
            f"(cast it first, e.g. torch: tensor.to(torch.float32))")


def dtype_name(dtype: Any) -> str:
    """'float32' for np.float32, np.dtype('float32') and torch.float32 alike."""
    s = str(dtype)
    if s.startswith("torch."):
        return s.replace("torch.", "")
    try:
        return np.dtype(dtype).name   # np.float32 (a type, whose str is "<class 'numpy.float32'>") too
    except TypeError:
        return s
