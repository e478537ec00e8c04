"""Checks of an optimiser's state: a checkpoint before it is loaded, and the live state before a step.

Both run before anything changes, so a refused checkpoint or step leaves parameters, moments and
counters exactly as they were. Messages say what, got, expected (StateDictError, a ValueError).

Shapes: a parameter (V, D) or (D,); its per-parameter state arrays have the same shape; ``step``
and ``step_count`` are integer scalars.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tokenpos.numpy.module import Parameter
from tokenpos.tables.checks.validation import check_state_mapping
from tokenpos.tables.errors import StateDictError

StateDtype = Callable[[Parameter, str], np.dtype]


def _count(key: str, value: np.ndarray) -> int:
    """A non-negative integer scalar (``step_count``, ``<i>.step``)."""
    if value.shape != () or value.dtype.kind not in "iu":
        raise StateDictError(f"optimizer state {key!r} must be an integer scalar, got shape {value.shape} and dtype "
                             f"{value.dtype}; expected shape () and an integer dtype")
    if int(value) < 0:
        raise StateDictError(f"optimizer state {key!r} is {int(value)}; expected a count >= 0")
    return int(value)


def check_optimizer_state(state: dict[str, Any], params: Sequence[Parameter], names: tuple[str, ...],
                          state_dtype: StateDtype) -> tuple[dict[int, dict[str, Any]], int]:
    """Validate a whole ``state_dict()`` and build the state it describes; nothing is changed.

    Every parameter's entry is complete (all of ``names`` or none), every array has its parameter's
    shape and the expected dtype, moments of squares (``v``) are >= 0, counts are integers >= 0 and
    no parameter counts more steps than the optimiser.

    Returns:
        ``({id(param): {name: copy}}, step_count)``.
    Raises:
        StateDictError: the first problem, naming the key.
    """
    check_state_mapping(state)
    arrays = {str(k): np.asarray(v) for k, v in state.items()}
    if "step_count" not in arrays:
        raise StateDictError("optimizer state_dict needs a scalar 'step_count'; got keys " + str(sorted(arrays)))
    step_count = _count("step_count", arrays["step_count"])
    new: dict[int, dict[str, Any]] = {}
    by_index: dict[int, set[str]] = {}
    for key, value in arrays.items():
        if key == "step_count":
            continue
        index, _, name = key.partition(".")
        if not index.isdigit() or int(index) >= len(params) or name not in names:
            raise StateDictError(f"optimizer state key {key!r} is not expected; expected 'step_count' and "
                                 f"'<i>.<name>' with i < {len(params)} and name in {names}")
        p = params[int(index)]
        if name == "step":
            count = _count(key, value)
            if count > step_count:
                raise StateDictError(f"optimizer state {key!r} is {count}, more than step_count {step_count}; "
                                     f"expected <= step_count")
            new.setdefault(id(p), {})[name] = count
        else:
            want_dtype = state_dtype(p, name)
            if value.shape != p.data.shape or value.dtype != want_dtype:
                raise StateDictError(f"optimizer state {key!r} has shape {value.shape} and dtype {value.dtype}, "
                                     f"expected shape {p.data.shape} and dtype {want_dtype}")
            if not np.isfinite(value).all():                  # NaN passed the >= 0 test below and every later step
                raise StateDictError(f"optimizer state {key!r} has non-finite entries (NaN or inf); expected finite "
                                     f"moments")
            if name == "v" and bool(np.any(value < 0)):
                raise StateDictError(f"optimizer state {key!r} has negative entries; a second moment is >= 0")
            new.setdefault(id(p), {})[name] = value.copy()
        by_index.setdefault(int(index), set()).add(name)
    for i, got in sorted(by_index.items()):
        if got != set(names):
            raise StateDictError(f"optimizer state of parameter {i} is incomplete: has {sorted(got)}, missing "
                                 f"{sorted(set(names) - got)}; expected all of {list(names)} or none")
    return new, step_count


def check_state_fits(index: int, p: Parameter, state: dict[str, Any]) -> None:
    """The live state of parameter ``index`` still has its parameter's shape (before a step).

    Raises:
        StateDictError: e.g. after ``TokenEmbedding.resize()`` changed the table under the optimiser.
    """
    for name, value in state.items():
        shape = getattr(value, "shape", None)
        if shape is not None and shape != p.data.shape:
            raise StateDictError(
                f"optimizer state '{index}.{name}' has shape {shape}, but parameter {index} now has shape "
                f"{p.data.shape} (resized after the optimiser started?); expected equal shapes: create a new "
                f"optimiser for the resized parameter (nothing was updated)")
