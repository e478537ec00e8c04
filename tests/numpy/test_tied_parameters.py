"""A Parameter registered under two names (a tied head, ``self.head = self.emb.weight``) is one parameter.

Guard (issue 28, item 1): ``Module.named_parameters`` / ``parameters`` list a tied Parameter once, as
torch's do, so an optimiser updates it once per step; ``state_dict`` keeps every key, as torch's does;
an optimiser given the same Parameter twice refuses it. Covered for every public NumPy layer with
parameters (``tests/numpy/layers.py``), against the torch twin's names and keys, and for the tied
output head of TokenEmbedding (lookup + attend into one table) against torch's update.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
from tests.numpy.layers import SPECS, build, public_layer_classes
from tokenpos.numpy.optim import SGD, Adam, AdamW


class _TiedNumpy(tpn.Module):
    """The layer, and each of its parameters registered a second time under ``tied_<name>``."""

    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.layer = layer
        for name, p in list(layer.named_parameters()):
            setattr(self, "tied_" + name.replace(".", "_"), p)


class _TiedTorch(torch.nn.Module):
    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.layer = layer
        for name, p in list(layer.named_parameters()):
            setattr(self, "tied_" + name.replace(".", "_"), p)


def test_every_public_layer_is_covered() -> None:
    assert public_layer_classes() == set(SPECS), "add the new layer to tests/numpy/layers.py HAND_SPECS"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tied_parameters_are_listed_once_and_kept_twice_in_state_dict(name: str) -> None:
    layer = build(name)
    tied = _TiedNumpy(layer)
    assert [id(p) for p in tied.parameters()] == [id(p) for p in layer.parameters()]
    assert len(list(tied.named_parameters())) == len(list(layer.named_parameters()))
    keys = [n for n, _ in tied.named_parameters(remove_duplicate=False)]
    assert len(keys) == 2 * len(list(layer.named_parameters()))
    # torch semantics, checked against the torch twin: names once, state_dict keys twice
    twin = _TiedTorch(build(name, "torch"))
    assert [n for n, _ in tied.named_parameters()] == [n for n, _ in twin.named_parameters()]
    assert sorted(tied.state_dict()) == sorted(twin.state_dict())
    # a state_dict of the tied module loads back (every key expected, as torch's strict load)
    tied.load_state_dict(tied.state_dict())
    tied.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()
                          if v.is_floating_point()}, strict=False)


@pytest.mark.parametrize("opt", [SGD, Adam, AdamW])
@pytest.mark.parametrize("name", sorted(n for n in SPECS if list(build(n).named_parameters())))
def test_one_step_on_tied_module_equals_single_registration(name: str, opt: Any) -> None:
    single, twice = build(name), build(name)
    tied = _TiedNumpy(twice)
    rng = np.random.default_rng(0)
    for p_single, p_tied in zip(single.parameters(), tied.parameters(), strict=True):
        g = rng.standard_normal(p_single.shape).astype(p_single.dtype)
        p_single.grad, p_tied.grad = g, g.copy()
    opt(single.parameters(), lr=0.1).step()
    opt(tied.parameters(), lr=0.1).step()
    for (n, a), (_, b) in zip(single.named_parameters(), twice.named_parameters(), strict=True):
        np.testing.assert_array_equal(a.data, b.data, err_msg=n)


def test_optimiser_refuses_the_same_parameter_twice() -> None:
    emb = tpn.TokenEmbedding(10, 4)
    with pytest.raises(tpn.ConfigError, match="same Parameter at indices 0 and 1"):
        SGD([emb.weight, emb.weight], lr=0.1)


class _NumpyLM(tpn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = tpn.TokenEmbedding(12, 4, seed=3)
        self.head = self.emb.weight                    # the tied output head


class _TorchLM(torch.nn.Module):
    def __init__(self, weight: np.ndarray) -> None:
        super().__init__()
        import tokenpos.torch as tpt

        self.emb = tpt.TokenEmbedding(12, 4)
        with torch.no_grad():
            self.emb.weight.copy_(torch.from_numpy(weight))
        self.head = self.emb.weight


@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_tied_head_step_matches_torch(opt: str) -> None:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 12, size=(2, 5))
    h = rng.standard_normal((2, 5, 4)).astype(np.float32)
    g_out = rng.standard_normal((2, 5, 4)).astype(np.float32)
    g_logits = rng.standard_normal((2, 5, 12)).astype(np.float32)
    model = _NumpyLM()
    ref = _TorchLM(model.emb.weight.data.copy())
    assert len(model.parameters()) == len(list(ref.parameters())) == 1
    model.emb(ids)
    model.emb.backward(g_out)
    model.emb.attend(h)
    model.emb.attend_backward(g_logits)
    (tpn.optim.SGD if opt == "SGD" else tpn.optim.Adam)(model.parameters(), lr=0.1).step()
    out = ref.emb(torch.from_numpy(ids))
    logits = torch.from_numpy(h) @ ref.head.T
    ((out * torch.from_numpy(g_out)).sum() + (logits * torch.from_numpy(g_logits)).sum()).backward()
    (torch.optim.SGD if opt == "SGD" else torch.optim.Adam)(ref.parameters(), lr=0.1).step()
    np.testing.assert_allclose(model.emb.weight.data, ref.emb.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
