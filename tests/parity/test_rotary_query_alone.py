"""``apply(q)`` without k, in both backends, for every rotary layer: q' equals the q' of a call with
keys (q itself), k' is None, the gradient of q is the same, packed too; ``key_positions`` without k
is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.parity.helpers import assert_fn_parity
from tokenpos.tables import ConfigError

LAYOUTS = {"bhld": (2, 4, 5, 8), "blhd": (2, 5, 4, 8), "thd": (5, 4, 8)}
LAYERS = {
    "rope": lambda be, layout: be.RotaryEmbedding(8, qk_layout=layout),
    "xpos": lambda be, layout: be.XPosRotaryEmbedding(8, qk_layout=layout),
    "mrope": lambda be, layout: be.MRotaryEmbedding(8, mrope_section=[2, 1, 1], qk_layout=layout),
}


def _q(layout: str) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(LAYOUTS[layout])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_numpy_query_alone_equals_the_pair_and_its_backward(name: str, layout: str) -> None:
    q = _q(layout)
    g = np.random.default_rng(4).standard_normal(q.shape)
    layer = LAYERS[name](tpn, layout)
    got, none = layer.apply(q)
    dq, dk = layer.backward(g)
    want, _ = layer.apply(q, q)
    want_dq, _ = layer.backward(g, np.zeros_like(g))
    assert none is None and dk is None
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(dq, want_dq)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_torch_query_alone_equals_the_pair_and_its_gradient(name: str, layout: str) -> None:
    q = torch.tensor(_q(layout), requires_grad=True)
    layer = LAYERS[name](tpt, layout)
    got, none = layer.apply(q)
    (dq,) = torch.autograd.grad(got.square().sum(), q)
    want, _ = layer.apply(q, q.detach())
    (want_dq,) = torch.autograd.grad(want.square().sum(), q)
    assert none is None
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(dq, want_dq, rtol=0, atol=0)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_query_alone_numpy_torch_parity(name: str, layout: str) -> None:
    """apply(q) and its gradient, NumPy against torch through the one parity helper."""
    np_layer, t_layer = LAYERS[name](tpn, layout), LAYERS[name](tpt, layout)
    assert_fn_parity(lambda q: np_layer.apply(q)[0], lambda g: np_layer.backward(g)[0],
                     lambda q: t_layer.apply(q)[0], [_q(layout)])


@pytest.mark.parametrize("backend", [tpn, tpt])
@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_packed_query_alone(name: str, backend: Any) -> None:
    q, cu = _q("thd"), np.array([0, 2, 5])
    if backend is tpt:
        q, cu = torch.tensor(q), torch.tensor(cu)
    layer = LAYERS[name](backend, "thd")
    got, none = layer.apply(q, cu_seqlens=cu)
    assert none is None
    np.testing.assert_array_equal(np.asarray(got), np.asarray(layer.apply(q, q, cu_seqlens=cu)[0]))


@pytest.mark.parametrize("backend", [tpn, tpt])
def test_key_positions_without_k_are_refused(backend: Any) -> None:
    q = _q("bhld")
    pos = np.arange(5)
    if backend is tpt:
        q, pos = torch.tensor(q), torch.tensor(pos)
    with pytest.raises(ConfigError, match="key_positions given without k"):
        backend.RotaryEmbedding(8).apply(q, key_positions=pos)
