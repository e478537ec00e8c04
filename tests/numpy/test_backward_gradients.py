"""Every NumPy backward checks the gradient it is handed (``tables.checks.validation.check_grad``): a
floating array of exactly the forward output's shape. A gradient of another shape was broadcast into a
wrong dx and wrong parameter gradients (LayerNorm, RMSNorm) or gave a dx of a made-up shape (every
rotary layer); an integer one truncated dx; a complex one lost its imaginary part with a warning. Each
is now a typed error, and the layer's gradients are unchanged by the refused call."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.ngram_cases import tiny_ngram_kwargs
from tests.public_layers import build_scheme_layer, derived_case, scheme_classes
from tokenpos.numpy import functional as F
from tokenpos.tables import ConfigError, DtypeError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 8)).astype(np.float32)           # (B, L, D)
Q = RNG.standard_normal((2, 4, 3, 8)).astype(np.float32)        # (B, H, L, Dh)
IDS = np.array([[1, 2, 3], [4, 5, 1]])


def _rotary(layer: Any, *args: Any) -> tuple[Any, Callable[[np.ndarray], Any]]:
    q, k = layer.apply(Q, Q[:, :2], *args)
    return q, lambda g: layer.backward(g, np.ones_like(k))


def _bias(layer: Any) -> tuple[Any, Callable[[np.ndarray], Any]]:
    return layer(3, 3), layer.backward


def _additive(layer: Any) -> tuple[Any, Callable[[np.ndarray], Any]]:
    return layer(IDS), layer.backward


Case = Callable[[], tuple[Any, Callable[[np.ndarray], Any]]]
BY_KIND: dict[str, Callable[[Any], tuple[Any, Callable[[np.ndarray], Any]]]] = {
    "rotary": _rotary, "bias": _bias, "additive": _additive}


def _registered(name: str) -> Case:
    """The case of registered scheme class ``name`` without a hand-written one: its registry defaults (Dh = 8,
    H = 2), called as its kind says (rotary: q, k at the default positions; bias: (3, 3); additive: the
    positions IDS)."""
    def case() -> tuple[Any, Callable[[np.ndarray], Any]]:
        with derived_case("HAND_CASES of tests/numpy/test_backward_gradients.py", name):
            layer = build_scheme_layer(name, "numpy")
            return BY_KIND[layer.kind](layer)
    return case


# name -> () -> (the forward output, backward(grad) for the first output); fresh layer per call
HAND_CASES: dict[str, Case] = {
    "TokenEmbedding": lambda: (lambda m: (m(IDS), m.backward))(tpn.TokenEmbedding(8, 8, seed=0)),
    "TokenEmbedding.attend": lambda: (lambda m: (m.attend(X), m.attend_backward))(tpn.TokenEmbedding(8, 8, seed=0)),
    "TokenEmbedding.loss": lambda: (lambda m: (m.loss(X, IDS, reduction="none"), m.loss_backward))(
        tpn.TokenEmbedding(8, 8, seed=0)),
    "PerLayerEmbedding": lambda: (lambda m: (m(IDS), m.backward))(tpn.PerLayerEmbedding(8, 2, 4, seed=0)),
    "HashedNgramEmbedding": lambda: (lambda m: (m(IDS), m.backward))(
        tpn.HashedNgramEmbedding(**tiny_ngram_kwargs(8))),
    "LearnedPositionalEmbedding": lambda: (lambda m: (m(IDS), m.backward))(
        tpn.LearnedPositionalEmbedding(8, 8, seed=0)),
    "TransformerEmbedding": lambda: (lambda m: (m(IDS), m.backward))(
        tpn.TransformerEmbedding(8, 8, 8, norm="layernorm", seed=0)),
    "LayerNorm": lambda: (lambda m: (m(X), m.backward))(tpn.LayerNorm(8)),
    "RMSNorm": lambda: (lambda m: (m(X), m.backward))(tpn.RMSNorm(8)),
    "RotaryEmbedding": lambda: _rotary(tpn.RotaryEmbedding(8)),
    "XPosRotaryEmbedding": lambda: _rotary(tpn.XPosRotaryEmbedding(8)),
    "MRotaryEmbedding": lambda: _rotary(tpn.MRotaryEmbedding(8, mrope_section=[2, 1, 1])),
    "RotaryEmbedding2D": lambda: _rotary(tpn.RotaryEmbedding2D(8), np.array([[0, 0], [0, 1], [1, 0]])),
    "T5RelativePositionBias": lambda: _bias(tpn.T5RelativePositionBias(4, seed=0)),
    "FIRE": lambda: _bias(tpn.FIRE(4, seed=0)),
    "KERPLE": lambda: _bias(tpn.KERPLE(4, seed=0)),
    "scaled_dot_product_attention_backward": lambda: (lambda out_cache: (
        out_cache[0], lambda g: tpn.scaled_dot_product_attention_backward(g, out_cache[1])))(
        tpn.scaled_dot_product_attention_forward(Q, Q, Q, positional=tpn.RotaryEmbedding(8))),
    "tied_cross_entropy_backward": lambda: (lambda out_cache: (
        out_cache[0], lambda g: F.tied_cross_entropy_backward(g, out_cache[1])))(
        F.tied_cross_entropy_forward(X, RNG.standard_normal((8, 8)).astype(np.float32), IDS, reduction="none")),
}
BIASES = set(scheme_classes("numpy", "bias"))         # grad_bias (H, Lq, Lk) of any lengths
# fixed tables: their backward computes nothing, so no gradient can come out wrong
NOTHING_TO_COMPUTE = {"ALiBi", "SinusoidalPositionalEncoding", "SinCos2DPositionalEncoding"}
# every registered scheme with a backward: its hand-written case, else one from its registry entry
CASES: dict[str, Case] = {
    **{name: _registered(name) for name, cls in scheme_classes("numpy").items()
       if hasattr(cls, "backward") and name not in NOTHING_TO_COMPUTE}, **HAND_CASES}


def _grads(fn: Callable[[np.ndarray], Any]) -> dict[str, np.ndarray | None]:
    owner = getattr(fn, "__self__", None)
    if owner is None:
        return {}
    return {n: None if p.grad is None else p.grad.copy() for n, p in owner.named_parameters()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_gradient_of_another_shape_or_a_non_float_dtype_is_refused(name: str) -> None:
    out, backward = CASES[name]()
    good = np.ones(out.shape, np.float32)
    before = _grads(backward)
    bad_shapes = [np.ones(out.shape + (1,), np.float32), np.ones((2,) + out.shape, np.float32)]
    if name in BIASES:           # stateless: grad_bias (H, Lq, Lk) of any lengths; H and the rank are fixed
        bad_shapes += [np.ones((out.shape[0] + 1,) + out.shape[1:], np.float32), np.ones(out.shape[1:], np.float32)]
    elif out.ndim:
        bad_shapes += [np.ones(out.shape[1:], np.float32), np.ones(out.shape[:-1] + (out.shape[-1] + 1,), np.float32)]
    for bad in bad_shapes:
        with pytest.raises(ConfigError, match=r"must have shape \(.*\), got " + re.escape(str(tuple(bad.shape)))):
            backward(bad)
    for dtype in (np.complex64, np.bool_) if name.startswith("tied") or name.endswith(".loss") else \
            (np.int64, np.complex64, np.bool_):
        with pytest.raises(DtypeError, match=f"must be a floating-point array, got dtype {np.dtype(dtype).name}"):
            backward(good.astype(dtype))
    after = _grads(backward)
    for key, grad in before.items():                      # the refused calls changed nothing
        assert (grad is None and after[key] is None) or np.array_equal(grad, after[key]), key
    backward(good)                                        # the right gradient still works


def test_every_layer_with_a_backward_is_covered() -> None:
    """A new NumPy layer with a backward is added to CASES (or to NOTHING_TO_COMPUTE with the reason)."""
    covered = {name.split(".")[0] for name in CASES} | NOTHING_TO_COMPUTE
    for name in tpn.__all__:
        obj = getattr(tpn, name)
        if inspect.isclass(obj) and hasattr(obj, "backward") and obj.__name__ == name:
            assert name in covered, name


def test_grad_k_after_a_call_without_k_is_refused() -> None:
    rope = tpn.RotaryEmbedding(8)
    q, none = rope.apply(Q)
    assert none is None
    with pytest.raises(ConfigError, match=r"grad_k given, but apply was called without k"):
        rope.backward(np.ones_like(q), np.ones((2, 1, 3, 8), np.float32))
    dq, dk = rope.backward(np.ones_like(q))
    assert dq.shape == Q.shape and dk is None


def test_an_integer_loss_gradient_is_an_exact_scale() -> None:
    tok = tpn.TokenEmbedding(8, 8, seed=0)
    tok.loss(X, IDS)
    a = tok.loss_backward(2)
    tok.loss(X, IDS)
    np.testing.assert_array_equal(a, tok.loss_backward(2.0))
