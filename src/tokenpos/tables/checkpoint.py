"""Reading and writing safetensors checkpoints, for both backends: one place for the file format rules.

Every file tokenpos writes carries the metadata ``{"format": "tokenpos", "class": <class name>}``.
Reading a file:

- a missing path, a directory, an unreadable file, or bytes that are not a safetensors file (random,
  truncated, corrupt, a pickle renamed ``.safetensors``) raise ``StateDictError`` naming the file and
  the cause, never safetensors' own ``SafetensorError`` (which is not a ValueError) or a bare OSError;
- a file whose metadata names another class (a TokenEmbedding file loaded into a
  LearnedPositionalEmbedding) is refused before any tensor is read;
- files without that metadata (older tokenpos, or written by hand) still load; the state_dict check
  of the layer then decides whether they fit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import numpy_dtype_message, numpy_holds
from tokenpos.tables.errors import StateDictError

FORMAT = "tokenpos"
# safetensors' dtype codes -> dtype names (the names NumPy / torch use)
SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
                      "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
                      "F32": "float32", "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
                      "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}


def metadata(class_name: str) -> dict[str, str]:
    """The metadata written into every checkpoint of ``class_name``."""
    return {"format": FORMAT, "class": class_name}


def class_names(obj: Any) -> tuple[str, ...]:
    """The class names a file may name to load into ``obj``: its class and its base classes (a file of
    TokenEmbedding loads into a subclass of it, not the other way round)."""
    return tuple(c.__name__ for c in type(obj).__mro__)


def read_checkpoint(path: str | os.PathLike[str], accept: str | Iterable[str], *, framework: str = "numpy",
                    expected: Mapping[str, Any] | None = None) -> dict:
    """The tensors of the safetensors file ``path`` as ``{name: array}`` (NumPy arrays, or torch tensors
    with ``framework="pt"``).

    Args:
        accept: the class name(s) the file's metadata may name (``class_names(layer)``).
        expected: the dtype each key should have, named when a tensor cannot be read (optional).
    Raises:
        StateDictError: naming the file: missing, unreadable, not a safetensors file, or a file of
            another class; with ``framework="numpy"``, a tensor of a dtype NumPy has no type for
            (bfloat16, float8, ...), naming the key, its dtype and the expected dtype.
    """
    from safetensors import SafetensorError, safe_open

    target = Path(path)
    accepted = (accept,) if isinstance(accept, str) else tuple(accept)
    if not target.exists():
        raise StateDictError(f"checkpoint {str(target)!r} does not exist; expected a safetensors file")
    if target.is_dir():
        raise StateDictError(f"checkpoint {str(target)!r} is a directory; expected a safetensors file")
    try:
        with safe_open(str(target), framework=framework) as fh:
            meta = fh.metadata() or {}
            saved = meta.get("class") if meta.get("format") == FORMAT else None
            if saved is not None and saved not in accepted:
                raise StateDictError(f"checkpoint {str(target)!r} holds a {saved} state; expected a file saved by "
                                     f"{accepted[0]}")
            names = list(fh.keys())
            if framework == "numpy":                           # before any read: NumPy has no bfloat16 / float8
                for name in names:
                    code = fh.get_slice(name).get_dtype()
                    dtype = SAFETENSORS_DTYPES.get(code, code)
                    if not numpy_holds(dtype):
                        raise StateDictError(numpy_dtype_message(f"checkpoint {str(target)!r}: tensor", name, dtype,
                                                                 (expected or {}).get(name)))
            return {name: fh.get_tensor(name) for name in names}
    except StateDictError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, OverflowError) as exc:
        cause = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise StateDictError(f"checkpoint {str(target)!r} cannot be read as a safetensors file ({cause}); "
                             f"expected a file written by save()") from exc


def write_numpy(tensors: dict[str, np.ndarray], path: str | os.PathLike[str], class_name: str) -> None:
    """Write NumPy arrays as a safetensors file with the class metadata (never pickle)."""
    from safetensors.numpy import save_file

    arrays = {k: np.asarray(v) for k, v in tensors.items()}       # (np.ascontiguousarray makes 0-d arrays 1-d)
    save_file({k: v if v.flags.c_contiguous else v.copy() for k, v in arrays.items()}, str(path),
              metadata=metadata(class_name))
