"""``start_pos + L`` beyond int64 is a PositionError in every rotary class of both backends.

Guard (issue 28, item 10b): every rotary class (discovered: ``kind == "rotary"`` in ``tokenpos.numpy``
and ``tokenpos.torch`` and in ``tables.registry``; a registered class without arguments here takes its registry
defaults), through each of its entry points that take ``start_pos`` (``apply``,
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
from tests.public_layers import derived_case, public_layers, scheme_classes, scheme_kwargs
from tokenpos.tables.checks.validation import INT64_MAX, check_start_pos
from tokenpos.tables.errors import ConfigError, PositionError

L = 4
OVER = INT64_MAX - L + 2                  # the last position would be 2**63
# class name -> its arguments besides head_dim = 8; a registered rotary class not here: its registry defaults
HAND_KWARGS = {"RotaryEmbedding": {}, "XPosRotaryEmbedding": {}, "MRotaryEmbedding": {"mrope_section": [2, 1, 1]},
               "RotaryEmbedding2D": {}}
KWARGS = {**{n: scheme_kwargs(n) for n in scheme_classes("numpy", "rotary")}, **HAND_KWARGS}
METHODS = ("apply", "apply_forward", "rotate")


def _classes(module: Any) -> list[str]:
    """Every rotary class of ``module`` (its ``__all__`` and the registry), by class name."""
    return sorted(n for n, cls in public_layers(module.__name__.split(".")[-1]).items()
                  if getattr(cls, "kind", None) == "rotary")


def _layer(module: Any, name: str) -> Any:
    """A fresh layer of ``module``'s rotary class ``name`` with the arguments of ``KWARGS``, head_dim 8."""
    return public_layers(module.__name__.split(".")[-1])[name](**{"head_dim": 8, **KWARGS[name]})


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
    numpy_classes, torch_classes = public_layers("numpy"), public_layers("torch")
    for name in set(_classes(tpn)) & set(_classes(tpt)):
        for method in ("apply", "rotate"):
            assert hasattr(numpy_classes[name], method) == hasattr(torch_classes[name], method), (name, method)


def _call(layer: Any, method: str, x: Any, start_pos: int, positions: Any = None) -> None:
    if method == "rotate":
        layer.rotate(x, positions, start_pos=start_pos)
    else:
        getattr(layer, method)(x, x, positions, start_pos=start_pos)


ENTRY_POINTS = [(b, n, m) for b, module in (("numpy", tpn), ("torch", tpt)) for n in _classes(module)
                for m in METHODS if hasattr(public_layers(b)[n], m)]


@pytest.mark.parametrize(("backend", "name", "method"), ENTRY_POINTS)
def test_overflowing_start_pos_is_a_position_error(backend: str, name: str, method: str) -> None:
    module = tpn if backend == "numpy" else tpt
    with derived_case("HAND_KWARGS of tests/parity/test_rotary_start_pos_overflow.py", name, HAND_KWARGS):
        layer = _layer(module, name)
        x = np.zeros((1, 2, L, 8), np.float32)
        x = x if backend == "numpy" else torch.from_numpy(x)
        if name == "RotaryEmbedding2D":                     # positions are explicit: start_pos would be ignored
            with pytest.raises(ConfigError, match="start_pos"):
                _call(layer, method, x, OVER, _grid(backend))
            return
        if name == "XPosRotaryEmbedding" and method == "rotate":
            with pytest.raises(ConfigError, match="xPos scales q up and k down"):   # xPos never rotates alone
                _call(layer, method, x, OVER)
            return
        with pytest.raises(PositionError) as info:
            _call(layer, method, x, OVER)
        assert str(info.value) == _expected_message()
        if method != "rotate":                              # the mixed-dtype path builds its positions apart
            with pytest.raises(PositionError):
                getattr(layer, method)(x, x.astype(np.float64) if backend == "numpy" else x.double(), start_pos=OVER)


def _grid(backend: str) -> Any:
    """(row, col) positions of L = 4 patches (2-D RoPE's explicit positions)."""
    pos = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    return pos if backend == "numpy" else torch.from_numpy(pos)


@pytest.mark.parametrize("name", sorted(set(_classes(tpn)) & set(_classes(tpt))))
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_attention_with_overflowing_start_pos_is_a_position_error(backend: str, name: str) -> None:
    """Every rotary class in both attention functions: the start_pos of the queries (and of the keys, which
    a layer rotating q and k together gets as key positions) overflowing is the same PositionError."""
    module = tpn if backend == "numpy" else tpt
    q = np.zeros((1, 2, L, 8), np.float32)
    q = q if backend == "numpy" else torch.from_numpy(q)
    with derived_case("HAND_KWARGS of tests/parity/test_rotary_start_pos_overflow.py", name, HAND_KWARGS):
        positional = _layer(module, name)
        if name == "RotaryEmbedding2D":                     # positions are explicit: start_pos would be ignored
            with pytest.raises(ConfigError, match="start_pos"):
                module.scaled_dot_product_attention(q, q, q, positional=positional, positions=_grid(backend),
                                                    start_pos=OVER)
            return
        with pytest.raises(PositionError) as info:
            module.scaled_dot_product_attention(q, q, q, positional=positional, start_pos=OVER)
        assert str(info.value) == _expected_message()
