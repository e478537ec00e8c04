"""Whole-table state of a row-sharded layer (vocab-parallel embedding, hashed n-gram table): gather, slice, and
safetensors files on disk.

Shapes: V whole-table rows (unpadded: the vocab, or a hashed table's R), D row width, Vl rows per rank, W world
size. A layer says where its shard sits through ``layer.row_shard`` (:class:`RowShard`).

The file format is the one-process layer's checkpoint: one ``weight`` (V, D) tensor, metadata
``{"format": "tokenpos", "class": ...}`` (``TokenEmbedding``, ``HashedNgramEmbedding``). So a table written at
W = 4 loads at W = 2, at W = 1, and into the one-process layer, exactly (resharding is slicing).

Failures never leave ranks behind in a collective: ``save_full`` and ``load_full`` end with one
all-reduce of a failure flag, so if any rank failed, every rank raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tokenpos.tables.checks.validation import check_state_dict
from tokenpos.tables.errors import StateDictError
from tokenpos.torch.distributed._comm import all_ranks_ok

FILE_METADATA = {"format": "tokenpos", "class": "TokenEmbedding"}


@dataclass(frozen=True)
class RowShard:
    """Where a rank's shard sits in the whole (rows, cols) table: its first row ``start`` and its ``num_real``
    rows of the table (any further local rows are zero padding); ``file_class``: the one-process layer whose
    checkpoint format the whole table is written in."""

    rows: int
    cols: int
    start: int
    num_real: int
    file_class: str = "TokenEmbedding"


class _Spec:
    """``.shape`` / ``.dtype`` stand-in for the shared state_dict check (no tensor conversion)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, value: Any) -> None:
        self.shape, self.dtype = tuple(getattr(value, "shape", ())), getattr(value, "dtype", None)


def gather_rows(weight: torch.Tensor, vocab_size: int, group: Any, world: int) -> torch.Tensor:
    """Every rank's (Vl, D) shard -> the (V, D) table on every rank (one all-gather; none at W = 1)."""
    if world == 1:
        return weight[:vocab_size].clone()
    shards = [torch.empty_like(weight) for _ in range(world)]
    dist.all_gather(shards, weight.contiguous(), group=group)
    return torch.cat(shards)[:vocab_size]                                     # (V, D)


def _checked_weight(layer: Any, state_dict: Mapping[str, Any], strict: bool = True,
                    same_dtype: bool = False) -> torch.Tensor | None:
    """The (V, D) ``weight`` of a whole-table state_dict, checked (keys, shape; the dtype too with ``same_dtype``:
    the shard's, no cast) before any write."""
    given = {k: _Spec(v) for k, v in state_dict.items()}
    shard: RowShard = layer.row_shard
    shape: tuple[int, ...] = (int(shard.rows), int(shard.cols))
    dtype = layer.weight.dtype if same_dtype or "weight" not in given else given["weight"].dtype
    expected: dict[str, tuple[tuple[int, ...], Any]] = {"weight": (shape, dtype)}
    check_state_dict(given, expected, strict=strict, layer=f"{type(layer).__name__} (whole table)")
    if "weight" not in state_dict:
        return None
    w = state_dict["weight"]
    return torch.from_numpy(np.ascontiguousarray(w)) if isinstance(w, np.ndarray) else torch.as_tensor(w)


@torch.no_grad()
def _write_rows(layer: Any, full: torch.Tensor) -> None:
    start, n = layer.row_shard.start, layer.row_shard.num_real
    layer.weight[:n].copy_(full[start:start + n])
    layer.weight[n:].zero_()                                                  # padding rows


def load_rows(layer: Any, state_dict: Mapping[str, Any], strict: bool = True) -> None:
    """Copy this rank's rows of a whole (V, D) table of the shard's dtype into ``layer.weight`` (another dtype is
    refused, never cast); padding rows become zero."""
    full = _checked_weight(layer, state_dict, strict, same_dtype=True)
    if full is not None:
        _write_rows(layer, full)


def save_full(layer: Any, path: str | Path) -> None:
    """Gather the table and write it from rank 0 (temporary file + rename). Every rank must call."""
    from safetensors.torch import save

    from tokenpos._files import atomic_write_bytes

    full = layer.full_state_dict()["weight"]
    error: BaseException | None = None
    if layer.rank == 0:
        try:
            atomic_write_bytes(path, save({"weight": full.contiguous().cpu()},
                                           metadata={**FILE_METADATA, "class": layer.row_shard.file_class}))
        except (OSError, ValueError) as exc:
            error = exc
    if not all_ranks_ok(error is None, layer.group, layer.world_size):
        if error is not None:
            raise error
        raise OSError(f"rank 0 could not write the vocab-parallel checkpoint {str(path)!r}")


def read_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a missing, unreadable or corrupt file raises StateDictError naming it."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise StateDictError(f"checkpoint {str(p)!r} does not exist or is not a file; expected a safetensors file")
    try:
        return load_file(str(p))
    except Exception as exc:  # safetensors raises its own SafetensorError (not a ValueError)
        raise StateDictError(f"checkpoint {str(p)!r} is not a readable safetensors file: {exc}") from exc


def load_full(layer: Any, path: str | Path, strict: bool = True) -> None:
    """Every rank reads ``path`` and, only if all ranks succeeded, takes its rows (one all-reduce)."""
    error: BaseException | None = None
    full = None
    try:
        full = _checked_weight(layer, read_file(path), strict)
    except StateDictError as exc:
        error = exc
    if not all_ranks_ok(error is None, layer.group, layer.world_size):
        if error is not None:
            raise error
        raise StateDictError(f"another rank could not load the checkpoint {str(path)!r}; nothing was loaded")
    if full is not None:
        _write_rows(layer, full)
