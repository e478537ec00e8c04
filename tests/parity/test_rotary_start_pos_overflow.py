"""``start_pos + L`` beyond int64 is a PositionError in every rotary class of both backends.

Guard (issue 28, item 10b): every rotary class (discovered: ``kind == "rotary"`` in ``tokenpos.numpy``
and ``tokenpos.torch``), through each of its entry points that take ``start_pos`` (``apply``,
``apply_forward``, ``rotate``) and through both backends' attention functions, raises the
``PositionError`` of ``tables.checks.validation.check_start_pos`` (never torch's RuntimeError, never
a wrapped negative position) when the default positions ``start_pos + arange(L)`` would pass
2**63 - 1. 2-D RoPE has no default positions: there a start_pos with positions is a ConfigError.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.tables.checks.validation import INT64_MAX, check_start_pos
from tokenpos.tables.errors import ConfigError, PositionError

L = 4
OVER = INT64_MAX - L + 2                  # the last position would be 2**63
KWARGS = {"RotaryEmbedding": {}, "XPosRotaryEmbedding": {}, "MRotaryEmbedding": {"mrope_section": [2, 1, 1]},
          "RotaryEmbedding2D": {}}
METHODS = ("apply", "apply_forward", "rotate")


def _classes(module: Any) -> list[str]:
    return sorted(n for n in module.__all__ if isinstance(getattr(module, n), type)
                  and getattr(getattr(module, n), "kind", None) == "rotary")


def _expected_message() -> str:
    with pytest.raises(PositionError) as info:
        check_start_pos(OVER, L)
    return str(info.value)


def test_every_rotary_class_is_covered() -> None:
    assert set(_classes(tpn)) | set(_classes(tpt)) <= set(KWARGS)


def test_every_rotary_twin_has_the_same_entry_points() -> None:
    """A rotary class has ``apply`` and ``rotate`` in both backends or in neither (the NumPy xPos had no
    ``rotate`` until 2026-11-27: an AttributeError where the torch twin raised its ConfigError). The
    NumPy-only backward entry ``apply_forward`` is not compared."""
    for name in set(_classes(tpn)) & set(_classes(tpt)):
        for method in ("apply", "rotate"):
            assert hasattr(getattr(tpn, name), method) == hasattr(getattr(tpt, name), method), (name, method)


def _call(layer: Any, method: str, x: Any, start_pos: int, positions: Any = None) -> None:
    if method == "rotate":
        layer.rotate(x, positions, start_pos=start_pos)
    else:
        getattr(layer, method)(x, x, positions, start_pos=start_pos)


ENTRY_POINTS = [(b, n, m) for b, module in (("numpy", tpn), ("torch", tpt)) for n in _classes(module)
                for m in METHODS if hasattr(getattr(module, n), m)]


@pytest.mark.parametrize(("backend", "name", "method"), ENTRY_POINTS)
def test_overflowing_start_pos_is_a_position_error(backend: str, name: str, method: str) -> None:
    module = tpn if backend == "numpy" else tpt
    layer = getattr(module, name)(8, **KWARGS[name])
    x = np.zeros((1, 2, L, 8), np.float32)
    x = x if backend == "numpy" else torch.from_numpy(x)
    if name == "RotaryEmbedding2D":                         # positions are explicit: start_pos would be ignored
        pos = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
        with pytest.raises(ConfigError, match="start_pos"):
            _call(layer, method, x, OVER, pos if backend == "numpy" else torch.from_numpy(pos))
        return
    if name == "XPosRotaryEmbedding" and method == "rotate":
        with pytest.raises(ConfigError, match="xPos scales q up and k down"):   # xPos never rotates alone
            _call(layer, method, x, OVER)
        return
    with pytest.raises(PositionError) as info:
        _call(layer, method, x, OVER)
    assert str(info.value) == _expected_message()
    if method != "rotate":                                  # the mixed-dtype path builds its positions apart
        with pytest.raises(PositionError):
            getattr(layer, method)(x, x.astype(np.float64) if backend == "numpy" else x.double(), start_pos=OVER)


@pytest.mark.parametrize("name", ["RotaryEmbedding", "MRotaryEmbedding"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_attention_with_overflowing_start_pos_is_a_position_error(backend: str, name: str) -> None:
    module = tpn if backend == "numpy" else tpt
    q = np.zeros((1, 2, L, 8), np.float32)
    q = q if backend == "numpy" else torch.from_numpy(q)
    with pytest.raises(PositionError):
        module.scaled_dot_product_attention(q, q, q, positional=getattr(module, name)(8, **KWARGS[name]),
                                            start_pos=OVER)
