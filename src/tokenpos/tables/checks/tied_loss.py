"""The tied cross-entropy's checks and messages, shared by both backends.

``tied_cross_entropy(h (..., D), weight (V, D), targets (...))``: h and weight of one float dtype (and one
device, torch), targets integers in [0, V) or ``ignore_index``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import (
    _first_bad,
    _index_str,
    check_choice,
    check_float,
    check_int,
    dtype_name,
    index_array,
)
from tokenpos.tables.errors import ConfigError, DtypeError, TokenIdError

#: The accepted ``reduction`` values (``tokenpos.tables.formulas.tied_loss`` re-exports them: a check imports no
#: formula, docs/DESIGN.md).
REDUCTIONS = ("mean", "sum", "none")


def target_range_message(value: int, index: tuple[int, ...], vocab_size: int, ignore_index: int) -> str:
    """``target 1003 at index (1, 4) is out of range [0, 1003) and is not ignore_index=-100``."""
    return (f"target {int(value)} at index {_index_str(index)} is out of range [0, {int(vocab_size)}) "
            f"and is not ignore_index={int(ignore_index)}")


def target_dtype_message(dtype: Any, vocab_size: int, ignore_index: int) -> str:
    """``targets must be integers, got dtype float32; ...``."""
    return (f"targets must be integers, got dtype {dtype_name(dtype)}; expected an integer array with values in "
            f"[0, {int(vocab_size)}) or ignore_index={int(ignore_index)}")


def mismatch_message(what: str, h: Any, weight: Any) -> str:
    """``h and weight must have the same dtype, got h float32 and weight float64``."""
    return (f"h and weight must have the same {what}, got h {h} and weight {weight}; "
            f"convert one of them (e.g. h.to(weight.{what}))")


def check_shapes(h_shape: tuple[int, ...], w_shape: tuple[int, ...], t_shape: tuple[int, ...]) -> None:
    """h (..., D), weight (V, D) with V, D >= 1, targets h's shape without its last axis.

    Raises:
        ConfigError: any other shapes.
    """
    if len(w_shape) != 2 or w_shape[0] < 1 or w_shape[1] < 1:
        raise ConfigError(f"weight must have shape (V, D) with V, D >= 1, got {tuple(w_shape)}")
    if len(h_shape) < 1 or h_shape[-1] != w_shape[1]:
        raise ConfigError(f"h must have shape (..., {w_shape[1]}) (weight's D), got {tuple(h_shape)}")
    if tuple(t_shape) != tuple(h_shape[:-1]):
        raise ConfigError(f"targets must have shape {tuple(h_shape[:-1])} (h's without the last axis), "
                          f"got {tuple(t_shape)}")


def check_options(ignore_index: Any, label_smoothing: Any, reduction: Any, softcap: Any,
                  chunk_size: Any) -> tuple[int, float, str, float | None, int | None]:
    """The options, checked: (ignore_index, eps in [0, 1], reduction, softcap > 0 or None, chunk_size >= 1 or None).

    Raises:
        ConfigError: a bad option, naming it, the value and what is expected.
    """
    ignore_index = check_int("ignore_index", ignore_index)
    eps = check_float("label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_choice("reduction", reduction, REDUCTIONS)
    cap = None if softcap is None else check_float("softcap", softcap, low=0.0, low_inclusive=False)
    chunk = None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
    return ignore_index, eps, reduction, cap, chunk


def check_targets(targets: Any, vocab_size: int, ignore_index: int) -> np.ndarray:
    """Integer targets (...) each in [0, V) or equal to ``ignore_index``, as an int64 array.

    Raises:
        TokenIdError: a non-integer dtype, or the first value out of range that is not ``ignore_index``.
    """
    t = index_array(targets)
    if t.dtype.kind not in "iu":
        raise TokenIdError(target_dtype_message(t.dtype, vocab_size, ignore_index))
    if t.dtype == np.uint64 and t.size and int(t.max()) > np.iinfo(np.int64).max:
        bad = t > np.iinfo(np.int64).max
        index = _first_bad(bad)
        raise TokenIdError(target_range_message(int(t[index]), index, vocab_size, ignore_index))
    t = t.astype(np.int64, copy=False)
    bad = (t != ignore_index) & ((t < 0) | (t >= vocab_size))
    if bad.any():
        index = _first_bad(bad)
        raise TokenIdError(target_range_message(int(t[index]), index, vocab_size, ignore_index))
    return t


def check_same_dtype(h_dtype: Any, w_dtype: Any) -> None:
    """h and weight of one dtype (the tied loss never casts the table).

    Raises:
        DtypeError: two dtypes, both named.
    """
    if h_dtype != w_dtype:
        raise DtypeError(mismatch_message("dtype", dtype_name(h_dtype), dtype_name(w_dtype)))


def target_device_message(vocab_size: int, ignore_index: int, device: Any) -> str:
    """The device-side assert's text for a target out of range (no index or value: nothing is read)."""
    return (f"targets on {device} out of range: expected every target in [0, {int(vocab_size)}) or "
            f"ignore_index={int(ignore_index)} (a device-side check; call tokenpos.set_device_checks(True) for "
            "a typed error with the index and the value, at one host sync per call)")


def padded_target_message(value: int, index: tuple[int, ...], ignore_index: int, columns: int) -> str:
    """``target 1006 at index (1, 4) is a padding column ...``: a target whose logit is -inf on the rank that owns
    it (``VocabParallelEmbedding.attend``'s padding columns are -inf), when the real vocab was not given."""
    return (f"target {int(value)} at index {_index_str(index)} is a padding column of the vocab-parallel logits (its "
            f"logit is -inf) and is not ignore_index={int(ignore_index)}; expected a real class of the {int(columns)} "
            "columns (pass vocab_size= to check the targets' range before any collective)")


def smoothing_needs_vocab_size_message(eps: float, columns: int) -> str:
    """Label smoothing over vocab-parallel logits with padding (-inf) columns and no ``vocab_size=``."""
    return (f"label_smoothing={eps} needs vocab_size= (the real vocab V, e.g. the embedding's vocab_size): the "
            f"logits have padding columns (-inf) among their {int(columns)}, and the smoothing spreads over the V "
            "real classes")


def padded_target_device_message(ignore_index: int, device: Any) -> str:
    """The device-side assert's text for a target in a padding (-inf) column (nothing is read)."""
    return (f"targets on {device} in a padding column (logit -inf) of the vocab-parallel logits: expected real "
            f"classes or ignore_index={int(ignore_index)} (a device-side check; pass vocab_size= to check the range, "
            "or call tokenpos.set_device_checks(True) for a typed error with the index and the value)")

