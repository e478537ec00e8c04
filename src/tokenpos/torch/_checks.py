"""Input validation for the torch backend: same checks, same exception types, same texts as NumPy.

Cheap tensor reductions decide whether anything is wrong; only then is the offending tensor copied to
the CPU and handed to the NumPy check of :mod:`tokenpos.tables.validation`, which finds the first bad
index and raises. So the text is written once and is identical in both backends.

When the data-dependent checks run:
- CPU tensors: always (in eager mode).
- CUDA / other devices: only when :func:`set_device_checks` is on, because reading a device value
  synchronises the stream (and an out-of-range index would otherwise end in a device assert that
  poisons the CUDA context).
- Under ``torch.compile``: never (they would break the graph). Compile an already-validated pipeline,
  or validate in eager first. dtype checks are static and always run.

Shapes: ids / positions of any shape (...).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from tokenpos._config import device_checks_enabled
from tokenpos.tables.errors import ConfigError, PositionError, TokenIdError
from tokenpos.tables.validation import (
    check_positions,
    check_seq_len_or_positions,
    dtype_name,
    position_dtype_message,
    token_id_dtype_message,
)
from tokenpos.tables.validation import check_token_ids as np_check_token_ids

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def is_compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def _value_checks_apply(t: torch.Tensor) -> bool:
    if is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(t):    # vmap: no .item() to read
        return False
    return t.device.type == "cpu" or device_checks_enabled()


def resolve_dtype(dtype: Any) -> torch.dtype:
    """None -> torch's default dtype; torch or NumPy float dtypes -> the torch dtype; else ConfigError."""
    if dtype is None:
        return torch.get_default_dtype()
    dt: Any
    if isinstance(dtype, torch.dtype):
        dt = dtype
    else:
        try:
            dt = getattr(torch, np.dtype(dtype).name, None)
        except TypeError as exc:
            raise ConfigError(f"dtype must be a torch or NumPy float dtype, got {dtype!r}") from exc
    if dt not in DTYPES:
        listed = ", ".join(dtype_name(d) for d in DTYPES)
        raise ConfigError(f"dtype must be one of {listed}; got {dtype_name(dt if dt is not None else dtype)}")
    return dt


def _is_int_tensor(t: torch.Tensor) -> bool:
    return t.dtype in _INT_DTYPES


def as_index(t: torch.Tensor) -> torch.Tensor:
    """Checked ids/positions in a dtype that ``F.embedding`` and indexing accept (int32 / int64)."""
    return t if t.dtype in (torch.int32, torch.int64) else t.long()


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def check_token_ids(ids: Any, vocab_size: int, device: torch.device | None = None) -> torch.Tensor:
    """Integer ids with every value in [0, vocab_size); returns the (possibly converted) tensor.

    Raises:
        TokenIdError: a non-integer dtype (always), or a value out of range (see the module doc).
    """
    if not isinstance(ids, torch.Tensor):
        return torch.as_tensor(np_check_token_ids(ids, vocab_size), device=device)
    if not _is_int_tensor(ids):
        raise TokenIdError(token_id_dtype_message(dtype_name(ids.dtype), vocab_size))
    if ids.numel() and _value_checks_apply(ids):
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= vocab_size:
            np_check_token_ids(_numpy_view(ids), vocab_size)     # raises with the shared text
    return ids


def check_position_tensor(positions: Any, max_seq_len: int | None = None, *,
                          broadcast_to: tuple[int, ...] | None = None,
                          device: torch.device | None = None) -> torch.Tensor:
    """Non-negative integer positions, each < ``max_seq_len`` when given.

    ``broadcast_to`` names the shape the positions are used at, so the index in the message is the
    same as NumPy's (which checks the broadcast array).

    Raises:
        PositionError: non-integer dtype, a negative position, or one >= max_seq_len.
    """
    if not isinstance(positions, torch.Tensor):
        arr = np.asarray(positions)
        check_positions(np.broadcast_to(arr, broadcast_to) if broadcast_to else arr, max_seq_len)
        return torch.as_tensor(arr.astype(np.int64), device=device)
    if not _is_int_tensor(positions):
        raise PositionError(position_dtype_message(dtype_name(positions.dtype)))
    if positions.numel() and _value_checks_apply(positions):
        lo, hi = torch.aminmax(positions)
        if int(lo) < 0 or (max_seq_len is not None and int(hi) >= max_seq_len):
            arr = _numpy_view(positions)
            check_positions(np.broadcast_to(arr, broadcast_to) if broadcast_to else arr, max_seq_len)
    return positions


def check_seq_len(seq_len: int, max_seq_len: int | None) -> int:
    """An int L in [0, max_seq_len] (the ``forward(L)`` form); the NumPy check raises."""
    return int(check_seq_len_or_positions(seq_len, max_seq_len).shape[0])


def is_seq_len(arg: Any) -> bool:
    return isinstance(arg, numbers.Integral) and not isinstance(arg, bool)
