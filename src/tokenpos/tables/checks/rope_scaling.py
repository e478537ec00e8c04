"""The value checks of a RoPE scaling dict (HF ``rope_scaling`` / ``rope_parameters``) and their message,
written once; both backends reach them through ``rope_inv_freq``.

The formulas of ``tables.formulas.rope_scaling`` check each value they read with
:func:`check_scaling_number` and :func:`check_longrope_factors`; every such error names the key, the
rope_type, the value and what was expected (:func:`scaling_key_message`). Which keys a type accepts
(``SCALING_KEYS``) and :func:`~tokenpos.tables.formulas.rope_scaling.normalize_rope_scaling` stay with the
formulas, next to ``ROPE_INIT_FUNCTIONS``: one list of types, and one file to touch for a new scaling.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from tokenpos.tables.errors import ConfigError


def scaling_key_message(rope_type: str, key: str, value: Any, expected: str) -> str:
    """``rope_scaling['factor'] for rope_type 'linear' is 0.5; expected a number >= 1``."""
    return f"rope_scaling[{key!r}] for rope_type {rope_type!r} is {value!r}; expected {expected}"


def check_scaling_number(rope_type: str, params: Mapping[str, Any], key: str, *, minimum: float | None = None,
                         strict: bool = False) -> float:
    """``params[key]`` as a finite float (> or >= ``minimum`` when given); else ConfigError naming the key."""
    value = params[key]
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if ok and minimum is not None:
        ok = float(value) > minimum if strict else float(value) >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ConfigError(scaling_key_message(rope_type, key, value, f"a finite number{bound}"))
    return float(value)


def check_longrope_factors(params: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    """longrope's ``params[key]`` (short_factor / long_factor): n positive finite numbers -> (n,) float64."""
    value = params[key]
    arr = np.asarray(value, dtype=object)
    ok = arr.ndim == 1 and arr.shape[0] == n and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) and float(v) > 0
        for v in arr)
    if not ok:
        expected = f"a list of {n} positive numbers (rotary dim / 2)"
        raise ConfigError(scaling_key_message("longrope", key, value, expected))
    return arr.astype(np.float64)
