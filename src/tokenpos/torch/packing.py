"""Packed sequences in torch: per-token positions from ``cu_seqlens`` and back, on the data's device.

Shapes: N documents, T tokens; ``cu_seqlens`` (N + 1,) int32 / int64: 0, the cumulative lengths, T.
The formulas and messages are ``tokenpos.tables.formulas.packing`` / ``tables.checks.packing``.

No host sync when ``total`` is given: the positions come from tensor ops of sizes known on the host
(a scatter and a cumsum) and the values of ``cu_seqlens`` are checked on the CPU (a typed error) or, on
another device, by one device-side assert (``tokenpos.set_device_checks(True)``: read, typed error).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenpos._config import device_checks_enabled
from tokenpos.kernels import packing as kernels
from tokenpos.tables.checks.packing import (
    CU_SEQLENS_DTYPES,
    check_cu_seqlens,
    check_restarting_positions,
    check_total,
    cu_seqlens_device_check_message,
    cu_seqlens_device_message,
    cu_seqlens_dtype_message,
    cu_seqlens_shape_message,
    document_starts_shape_message,
)
from tokenpos.tables.checks.validation import check_start_pos
from tokenpos.tables.errors import ConfigError, DtypeError
from tokenpos.torch._checks import check_position_tensor, values_readable


def check_cu_seqlens_tensor(cu_seqlens: Any, total: Any = None, *, device: torch.device | None = None
                            ) -> torch.Tensor:
    """``cu_seqlens`` checked (the rules of ``tables.checks.packing.check_cu_seqlens``) -> (N + 1,) int32 /
    int64 on ``device`` (the data's; a tensor elsewhere is refused). Non-tensors: the NumPy check,
    then an int64 tensor on ``device``.

    Raises:
        DtypeError, ConfigError, PositionError: as the NumPy check (values: CPU, or with device checks on).
        ConfigError: a tensor on another device than ``device``.
    """
    total = check_total(total)
    if not isinstance(cu_seqlens, torch.Tensor):
        return torch.as_tensor(check_cu_seqlens(cu_seqlens, total), device=device)
    _check_layout(cu_seqlens, device)
    if cu_seqlens.is_meta or not values_readable(cu_seqlens):
        return cu_seqlens
    if cu_seqlens.is_cpu or device_checks_enabled():
        check_cu_seqlens(cu_seqlens.detach().cpu().numpy(), total)         # raises the typed error
        return cu_seqlens
    ok = (cu_seqlens[0] == 0) & (cu_seqlens[1:] >= cu_seqlens[:-1]).all()
    if total is not None:
        ok = ok & (cu_seqlens[-1] == total)
    torch._assert_async(ok, cu_seqlens_device_check_message(total, cu_seqlens.device))
    return cu_seqlens


_CU_DTYPES = tuple(getattr(torch, name) for name in CU_SEQLENS_DTYPES)     # the shared rule's dtypes


def _check_layout(cu_seqlens: torch.Tensor, device: torch.device | None) -> None:
    """What a ``cu_seqlens`` tensor must be before its values matter: int32 / int64, (N + 1,), on ``device``."""
    if cu_seqlens.dtype not in _CU_DTYPES:
        raise DtypeError(cu_seqlens_dtype_message(cu_seqlens.dtype))
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ConfigError(cu_seqlens_shape_message(tuple(cu_seqlens.shape)))
    if device is not None and cu_seqlens.device != torch.device(device):
        raise ConfigError(cu_seqlens_device_message(cu_seqlens.device, device))


def packed_positions(cu: torch.Tensor, total: int, starts: Any = 0) -> torch.Tensor:
    """Positions (T,) int64 of checked ``cu`` (N + 1,) ending at ``total``, counting from ``starts`` in every
    document (an int, or an (N,) int tensor on ``cu``'s device): tensor ops of a size known on the host (a
    scatter and a cumsum give each token its document), so no host sync."""
    cu = cu.long()
    inner = cu[1:-1]                                                   # where documents 2..N start
    marks = torch.zeros(total + 1, dtype=torch.long, device=cu.device).index_add_(0, inner, torch.ones_like(inner))
    doc = marks[:total].cumsum(0)                                      # (T,) the document of each token
    first = cu if isinstance(starts, int) and starts == 0 else cu[:-1] - starts    # where each document counts 0
    return torch.arange(total, device=cu.device) - first.index_select(0, doc)


def _device_starts(start_pos: Any, num_docs: int, device: torch.device) -> int | torch.Tensor:
    """``start_pos`` of a packed call whose values stay on ``device``: an int (checked), or (N,) ints (a 0-d tensor:
    one for all) as a tensor there (dtype, device and shape checked here; negative values by the device-side
    check of positions). A list or a NumPy array becomes a tensor first, so a compiled call traces no NumPy."""
    if isinstance(start_pos, (int, np.integer)) and not isinstance(start_pos, bool):
        return check_start_pos(int(start_pos), 0)
    if not isinstance(start_pos, torch.Tensor):
        start_pos = torch.as_tensor(start_pos, device=device)
    elif start_pos.device != device:
        raise ConfigError(f"start_pos is on {start_pos.device}, but the data is on {device}; expected start_pos on "
                          f"{device}")
    starts = check_position_tensor(start_pos)
    if starts.dim() == 0:
        return starts.long().expand(num_docs)
    return starts.reshape(_starts_shape(tuple(starts.shape), num_docs)).long()


def _starts_shape(shape: tuple[int, ...], num_docs: int) -> tuple[int]:
    if tuple(shape) != (num_docs,):
        raise ConfigError(document_starts_shape_message(tuple(shape), num_docs))
    return (num_docs,)


def document_positions(cu_seqlens: Any, total: int, device: torch.device, start_pos: Any = 0
                       ) -> tuple[torch.Tensor, int | None]:
    """The layers' packed positions: ``cu_seqlens`` checked (:func:`check_cu_seqlens_tensor`'s rules, on
    ``device``, ending at ``total``) and ``start_pos`` (where each document starts counting: an int, or one per
    document) -> (positions (T,) int64, ``end``), no host sync. ``end`` bounds ``max(positions) + 1``: with
    values on the host and a CPU layer it is read (``kernels.packing.document_positions``, which checks and
    computes in one pass over values it reads anyway); elsewhere ``total`` plus an int ``start_pos`` (known
    without reading the device), or None for per-document starts there (not known without a sync). So the
    caller needs no second look at the positions. ``total`` is T as the caller's own packed check returned it
    (``tables.checks.packing.check_packed_*_args``: TransformerEmbedding's ids, the rotary layers' q)."""
    if device.type == "cpu" and (not isinstance(start_pos, torch.Tensor)
                                 or (start_pos.is_cpu and values_readable(start_pos))):
        host = start_pos.numpy() if isinstance(start_pos, torch.Tensor) else start_pos
        if not isinstance(cu_seqlens, torch.Tensor):                   # a list, a NumPy array: host values
            pos, end = kernels.document_positions(cu_seqlens, total, host)
            return torch.from_numpy(pos), end
        if cu_seqlens.is_cpu and values_readable(cu_seqlens):
            if cu_seqlens.dtype not in _CU_DTYPES:                      # (before .numpy(): bf16 has no NumPy twin)
                raise DtypeError(cu_seqlens_dtype_message(cu_seqlens.dtype))
            pos, end = kernels.document_positions(cu_seqlens.numpy(), total, host)   # the shared checks
            return torch.from_numpy(pos), end
    cu = check_cu_seqlens_tensor(cu_seqlens, total, device=device)
    starts = _device_starts(start_pos, cu.shape[0] - 1, device)
    return packed_positions(cu, total, starts), (total + starts if isinstance(starts, int) else None)


def positions_from_cu_seqlens(cu_seqlens: Any, total: int | None = None, *, start_pos: Any = 0) -> torch.Tensor:
    """``cu_seqlens`` (N + 1,) -> positions (T,) int64 on its device, 0, 1, ... in every document (from
    ``start_pos`` in every document: an int, or (N,) ints, one per document, flash-attn's ``seqlen_offsets``).

    Give ``total`` (T) on an accelerator: without it T is read from ``cu_seqlens[-1]`` (one host sync).

    Raises:
        ConfigError: meta ``cu_seqlens`` without ``total`` (a meta tensor holds no T to read).
    """
    cu = check_cu_seqlens_tensor(cu_seqlens, total)
    if total is None and cu.is_meta:
        raise ConfigError("cu_seqlens is on the meta device, which holds no values: pass total= (T) to get "
                          "the (T,) positions")
    n = int(cu[-1]) if total is None else int(total)
    return packed_positions(cu, n, _device_starts(start_pos, cu.shape[0] - 1, cu.device))


def cu_seqlens_from_positions(positions: Any) -> torch.Tensor:
    """Positions (T,) or (1, T) restarting at 0 per document -> ``cu_seqlens`` (N + 1,) int32 on their
    device (the inverse of :func:`positions_from_cu_seqlens`). N depends on the values, so this reads
    them (a host sync on an accelerator): call it in the data pipeline, not in the model.

    Raises:
        ConfigError: meta positions (no values to find the documents in). PositionError: as NumPy's.
    """
    pos = check_position_tensor(positions)
    if pos.is_meta:
        raise ConfigError("positions are on the meta device, which holds no values; cu_seqlens depends on "
                          "where they restart at 0, so it needs real positions")
    if pos.dim() not in (1, 2) or (pos.dim() == 2 and pos.shape[0] != 1):
        raise ConfigError(f"positions of a packed row must have shape (T,) or (1, T), got {tuple(pos.shape)}")
    pos = pos.reshape(-1).long()
    if values_readable(pos):
        check_restarting_positions(pos.detach().cpu().numpy().astype(np.int64))
    starts = torch.nonzero(pos == 0).reshape(-1)
    end = torch.full((1,), pos.numel(), device=pos.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)
