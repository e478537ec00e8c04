"""PerLayerEmbedding: NumPy and torch give the same (..., L, P) rows and the same table gradient, with the
state_dict loaded across backends in both directions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.parity.helpers import assert_parity, build_pair

V, L, P = 17, 4, 3
IDS = np.array([[0, 5, 5, 16], [2, 0, 9, 1]])


@pytest.mark.parametrize("load_from", ["numpy", "torch"])
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 0}, {"scale": False}, {"dtype": np.float64, "padding_idx": 5}],
                         ids=["default", "padding", "unscaled", "float64"])
def test_forward_and_gradient_parity(kw, load_from):
    report = assert_parity("PerLayerEmbedding", (V, L, P), kw, args=(IDS,), load_from=load_from)
    assert set(report.errors) == {"out0", "grad:weight"}


def test_out_of_range_zero_parity_past_the_table():
    ids = np.array([[V, 3, V + 40], [1, 2 * V, 0]])
    assert_parity("PerLayerEmbedding", (V, L, P), {"out_of_range": "zero", "padding_idx": 0}, args=(ids,))


def test_the_same_state_dict_key_and_shape_in_both_backends():
    n, t = build_pair("PerLayerEmbedding", (V, L, P), {"padding_idx": 0})
    ns, ts = n.state_dict(), t.state_dict()
    assert list(ns) == list(ts) == ["weight"]
    assert ns["weight"].shape == tuple(ts["weight"].shape) == (V, L * P)
    np.testing.assert_array_equal(ns["weight"], ts["weight"].numpy())
    assert n.multiplier == t.multiplier


@pytest.mark.parametrize("quantized", [False, True], ids=["float32", "int8"])
def test_a_checkpoint_saved_by_either_backend_loads_in_the_other(tmp_path, quantized):
    kw = {"weight_dtype": np.int8} if quantized else {}
    n = tpn.PerLayerEmbedding(V, L, P, seed=0, **kw)
    t = tpt.PerLayerEmbedding(V, L, P, seed=5, **({"weight_dtype": torch.int8} if quantized else {}))
    n.save(tmp_path / "numpy.safetensors")
    t.load(tmp_path / "numpy.safetensors")
    np.testing.assert_array_equal(t(IDS).detach().numpy(), n(IDS))
    t.save(tmp_path / "torch.safetensors")
    back = tpn.PerLayerEmbedding(V, L, P, seed=9, **kw)
    back.load(tmp_path / "torch.safetensors")
    np.testing.assert_array_equal(back(IDS), n(IDS))
