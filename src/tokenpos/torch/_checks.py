"""Input validation for the torch backend: same checks, same exception types, same texts as NumPy.

Cheap tensor reductions decide whether anything is wrong; only then is the offending tensor copied to
the CPU and handed to the NumPy check of :mod:`tokenpos.tables.checks.validation`, which finds the first bad
index and raises. So the text is written once and is identical in both backends.

When the data-dependent checks run:
- CPU tensors in eager mode: always, reading the values (a typed TokenIdError / PositionError,
  raised before anything changes).
- CUDA / other devices (not meta): by default ONE device-side assert per checked tensor
  (``torch._assert_async`` on "every value in range", message
  ``tables.checks.device.device_range_message``), eager or compiled: no value is read on the host,
  nothing synchronises, and the call stays capturable in a CUDA graph. A bad value fails loudly on
  the device (CUDA: "device-side assert triggered", reported at the next synchronisation; the CUDA
  context is then unusable), never as a silent zero row (the Triton gather masks ids it cannot read).
  With :func:`set_device_checks` on, the values are read instead (one host sync per check) and the
  typed error of the CPU is raised.
- CPU tensors under ``torch.compile``: never (reading would break the graph). Compile an
  already-validated pipeline, or validate in eager first. dtype checks are static and always run.
- Tensors wrapped by ``torch.func`` transforms: read through functorch on the CPU; not checked on
  other devices.

Shapes: ids / positions of any shape (...).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from tokenpos._config import device_checks_enabled
from tokenpos.tables.checks.device import device_range_message
from tokenpos.tables.checks.tied_loss import target_device_message, target_range_message
from tokenpos.tables.checks.validation import (
    INT64_MAX,
    check_positions_at,
    check_seq_len_or_positions,
    check_token_ids,
    dtype_name,
    float_dtype_message,
    id_layout_message,
    position_dtype_message,
    token_id_dtype_message,
)
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, TokenIdError

transforms_active = torch._C._are_functorch_transforms_active   # torch.func transforms (grad, vmap) running

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the unsigned 16/32/64-bit dtypes have no min/max kernels in torch: their values are checked through
# NumPy (which accepts the same dtypes); ``as_index`` widens checked ids and positions to int64
_WIDE_UINT_DTYPES = (torch.uint16, torch.uint32, torch.uint64)
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, *_WIDE_UINT_DTYPES)


def calc_dtype(device: torch.device) -> torch.dtype:
    """The dtype of positions, frequencies and angles on ``device``: float64 (float32 on MPS, which has
    no float64), never less than float32, whatever the model dtype."""
    return torch.float32 if device.type == "mps" else torch.float64


def is_compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def is_wrapped(t: torch.Tensor) -> bool:
    """A tensor wrapped by a ``torch.func`` transform (vmap, grad): its values cannot be read here.
    Only while a transform runs (outside one, no tensor is wrapped: one cheap query decides); never
    under torch.compile, whose tracer cannot call the query (and traces transforms its own way)."""
    return (bool(transforms_active()) and not is_compiling()
            and bool(torch._C._functorch.is_functorch_wrapped_tensor(t)))


def values_readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read here: not traced by torch.compile, not wrapped by torch.func."""
    return not is_compiling() and not is_wrapped(t)


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


def as_index(t: torch.Tensor) -> torch.Tensor:
    """Checked ids/positions in a dtype that ``F.embedding`` and indexing accept (int32 / int64)."""
    return t if t.dtype in (torch.int32, torch.int64) else t.long()


def check_float_tensor(name: str, t: Any) -> torch.Tensor:
    """A float input (q, k, v, hidden states): a tensor of a floating dtype; the torch twin of
    ``tables.checks.validation.check_float_array`` (same message).

    Raises:
        DtypeError (a ConfigError and a TypeError): integer, bool or complex tensors, or a non-tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise DtypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise DtypeError(float_dtype_message(name, dtype_name(t.dtype)))
    return t


def _layout_name(layout: torch.layout, nested: bool) -> str | None:
    """None for a plain strided tensor, else the layout's name ("nested", "sparse_coo", ...)."""
    if nested:
        return "nested"
    return None if layout == torch.strided else str(layout).replace("torch.", "")


def _outside(t: torch.Tensor, high: int | None, what: str) -> np.ndarray | None:
    """``t``'s values as NumPy when one lies outside [0, high) (``high`` None: any int64), for the
    shared NumPy check to locate and raise; None when all lie inside, when they cannot be read here,
    or when the check is left to the device (see the module doc: on a non-CPU device without
    device checks, one device-side assert, :func:`_assert_on_device`). One reduction (``aminmax``;
    the wide unsigned dtypes, which have no min/max kernels, through NumPy). Inside a ``torch.func``
    transform even a plain tensor refuses ``.numpy()``: functorch is set aside to read the values."""
    if not t.numel():
        return None
    if not t.is_cpu:
        if t.is_meta:
            return None
        if not (device_checks_enabled() and values_readable(t)):
            if not is_wrapped(t):
                _assert_on_device(t, high, what)
            return None
    if not values_readable(t):
        return None
    wide = t.dtype in _WIDE_UINT_DTYPES
    if not wide:
        lo, hi = torch.aminmax(t)
        if int(lo) >= 0 and (high is None or int(hi) < high):
            return None
    with torch._C._DisableFuncTorch():
        values = t.detach().cpu().numpy()
    limit = INT64_MAX + 1 if high is None else high         # uint64 beyond int64 is refused even without a bound
    return values if not wide or int(values.max()) >= limit else None


def _assert_on_device(t: torch.Tensor, high: int | None, what: str) -> None:
    """One device-side assert that every value of ``t`` (on a non-CPU device) lies in [0, high)
    (``high`` None: >= 0): no value is read on the host (no sync; capturable in a CUDA graph; traced
    by torch.compile). The wide unsigned dtypes are compared as int64, where a uint64 value beyond
    int64 is negative, so it is refused too."""
    v = t if t.dtype in (torch.int32, torch.int64) else t.long()
    ok = v >= 0 if high is None else (v >= 0) & (v < high)
    torch._assert_async(ok.all(), device_range_message(what, high, t.device))


def check_token_id_tensor(ids: Any, vocab_size: int, *, device: torch.device | None = None) -> torch.Tensor:
    """Integer ids with every value in [0, vocab_size), returned as a tensor that indexes directly
    (int32 / int64; the other integer dtypes are widened to int64 after the check). The torch twin
    of NumPy's ``tables.checks.validation.check_token_ids``, whose messages it raises. Non-tensors go
    through that NumPy check and become an int64 tensor on ``device``, the device of the table they
    index: ids on the meta device (no values) are refused for a table that has values.

    Raises:
        TokenIdError: a non-integer dtype, a nested or sparse tensor, meta ids for a real table
            (always), or a value out of range (CPU; see the module doc for other devices, where a
            value out of range fails a device-side assert instead).
    """
    if not isinstance(ids, torch.Tensor):
        return torch.as_tensor(check_token_ids(ids, vocab_size), device=device)
    layout = _layout_name(ids.layout, ids.is_nested)
    if layout is not None:
        raise TokenIdError(id_layout_message("token ids", layout))
    if ids.dtype not in _INT_DTYPES:
        raise TokenIdError(token_id_dtype_message(ids.dtype, vocab_size))
    if ids.is_meta and device is not None and torch.device(device).type != "meta":
        raise TokenIdError(f"token ids are on the meta device (they hold no values), but the table is on "
                           f"{device}; expected ids on {device} (or the CPU)")
    values = _outside(ids, vocab_size, "token ids")
    if values is not None:
        check_token_ids(values, vocab_size)               # raises with the shared text
    return as_index(ids)


_INDEX_DTYPES = (torch.int64, torch.int32)


def index_tensor(ids: Any, vocab_size: int, weight: torch.Tensor) -> torch.Tensor:
    """Ids as an op takes them, checked as far as they can be without reading a value: an int64 / int32 CPU
    tensor (not nested) is returned as it is, and its values are read where they are
    gathered (torch's gather and the kernel both check every index; the layer then raises the shared
    TokenIdError on its error path, :func:`check_token_id_tensor`). Anything else (other dtypes, lists and
    arrays, nested / sparse / meta tensors, other devices, where the check is one device-side assert) is
    checked by :func:`check_token_id_tensor` here, before the op."""
    if type(ids) is torch.Tensor and ids.dtype in _INDEX_DTYPES and ids.is_cpu and not ids.is_nested:
        return ids                      # (a sparse layout or a table elsewhere: refused by the op, then named)
    return check_token_id_tensor(ids, vocab_size, device=weight.device)


def check_position_tensor(positions: Any, max_seq_len: int | None = None, *,
                          broadcast_to: tuple[int, ...] | None = None,
                          device: torch.device | None = None) -> torch.Tensor:
    """Non-negative integer positions, each < ``max_seq_len`` when given.

    ``broadcast_to`` names the shape the positions are used at, so the index in the message is the
    same as NumPy's (which checks the broadcast array).

    Raises:
        PositionError: non-integer dtype, a negative position, or one >= max_seq_len (CPU; on other
            devices those values fail a device-side assert, see the module doc).
    """
    if not isinstance(positions, torch.Tensor):
        arr = np.asarray(positions)
        check_positions_at(arr, broadcast_to, max_seq_len)
        return torch.as_tensor(arr.astype(np.int64), device=device)
    layout = _layout_name(positions.layout, positions.is_nested)
    if layout is not None:
        raise PositionError(id_layout_message("positions", layout))
    if positions.dtype not in _INT_DTYPES:
        raise PositionError(position_dtype_message(positions.dtype))
    values = _outside(positions, max_seq_len, "positions")
    if values is not None:
        check_positions_at(values, broadcast_to, max_seq_len)   # raises with the shared text
    return positions


def check_seq_len(seq_len: int, max_seq_len: int | None) -> int:
    """An int L in [0, max_seq_len] (the ``forward(L)`` form); the NumPy check raises."""
    return int(check_seq_len_or_positions(seq_len, max_seq_len).shape[0])


def is_seq_len(arg: Any) -> bool:
    return isinstance(arg, numbers.Integral) and not isinstance(arg, bool)


def check_target_values(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """Each target in [0, V) or ``ignore_index``: read on the CPU (a TokenIdError naming the first bad one),
    one device-side assert elsewhere (no host sync; ``tokenpos.set_device_checks(True)`` reads them instead)."""
    if targets.numel() == 0 or targets.is_meta:
        return
    t = targets if targets.dtype in (torch.int32, torch.int64) else targets.long()
    bad = (t != ignore_index) & ((t < 0) | (t >= vocab_size))
    if not targets.is_cpu and not (device_checks_enabled() and values_readable(targets)):
        if not is_wrapped(targets):
            torch._assert_async(~bad.any(), target_device_message(vocab_size, ignore_index, targets.device))
        return
    if values_readable(targets) and bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise TokenIdError(target_range_message(int(targets[index]), index, vocab_size, ignore_index))
