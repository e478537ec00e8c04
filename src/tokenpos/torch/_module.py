"""What every tokenpos torch layer adds to ``nn.Module``: cross-backend state_dicts and safetensors.

``load_state_dict`` accepts NumPy arrays as well as tensors (a NumPy layer's ``state_dict()`` loads
directly), and checks keys and shapes with the shared ``tables`` check first, so a state_dict that
does not fit raises the same ``StateDictError`` (a ValueError) with the same text as the NumPy
backend, before anything is written. Unlike NumPy, dtypes are cast on load, as ``nn.Module`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_state_dict


class _Spec:
    """What the shared check reads of an entry: ``.shape`` and ``.dtype``."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


class TokenposModule(nn.Module):
    """``nn.Module`` plus NumPy-compatible ``load_state_dict`` and safetensors ``save`` / ``load``."""

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                   for k, v in state_dict.items()}
        # dtypes are cast on load, so each entry is expected in its own dtype; the check sees only
        # (shape, dtype) stand-ins (never converts a tensor to NumPy: bf16 / GPU tensors stay put)
        given = {k: _Spec(tuple(getattr(v, "shape", ())), getattr(v, "dtype", None)) for k, v in tensors.items()}
        expected = {k: (tuple(v.shape), given[k].dtype if k in given else v.dtype)
                    for k, v in self.state_dict().items()}
        check_state_dict(given, expected, strict=strict, layer=type(self).__name__)
        return super().load_state_dict(tensors, strict=strict, assign=assign)

    def save(self, path: str | Path) -> None:
        """Write the state_dict as a safetensors file (readable by either backend's ``load``), with this
        class in its metadata."""
        from safetensors.torch import save_file

        from tokenpos.tables.checkpoint import metadata

        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(tensors, str(path), metadata=metadata(type(self).__name__))

    def load(self, path: str | Path, strict: bool = True) -> None:
        """Load a safetensors file written by ``save`` (either backend) into this layer.

        Raises:
            StateDictError: naming the file: missing, unreadable, not safetensors, written by another
                class (its metadata), or a state that does not fit; nothing is written then.
        """
        from tokenpos.tables.checkpoint import class_names, read_checkpoint

        self.load_state_dict(read_checkpoint(path, class_names(self), framework="pt"), strict=strict)
