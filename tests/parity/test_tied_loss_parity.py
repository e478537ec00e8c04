"""TokenEmbedding.loss: the NumPy layer and the torch layer on the same table give the same loss and gradients,
and refuse the same bad targets with the same text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables.errors import TokenIdError


@pytest.mark.parametrize(("reduction", "eps", "cap"), [("mean", 0.0, None), ("sum", 0.1, 2.0), ("none", 0.2, None)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpy_and_torch_losses_and_gradients_agree(reduction: str, eps: float, cap: float | None, dtype: str) -> None:
    V, D = 1003, 16
    npl = tpn.TokenEmbedding(V, D, dtype=getattr(np, dtype), seed=0)
    tl = tpt.TokenEmbedding(V, D, dtype=getattr(torch, dtype))
    tl.load_state_dict({k: torch.from_numpy(v) for k, v in npl.state_dict().items()})
    rng = np.random.default_rng(1)
    h = rng.standard_normal((3, 4, D)).astype(dtype)
    t = rng.integers(0, V, (3, 4))
    t[0, 0] = -100
    g = rng.standard_normal(t.shape if reduction == "none" else ()).astype(dtype)
    loss = npl.loss(h, t, reduction=reduction, label_smoothing=eps, softcap=cap, chunk_size=5)
    dh = npl.loss_backward(g)
    th = torch.from_numpy(h).requires_grad_()
    tloss = tl.loss(th, torch.from_numpy(t), reduction=reduction, label_smoothing=eps, softcap=cap, chunk_size=5)
    tloss.backward(torch.as_tensor(g))
    scale = TOL["parity.f64" if dtype == "float64" else "parity.f32"]["scale"]
    for a, b in ((loss, tloss), (dh, th.grad), (npl.weight.grad, tl.weight.grad)):
        b = b.detach().numpy()
        assert np.abs(a - b).max() <= scale * np.abs(b).max()


def test_the_same_bad_target_gives_the_same_error_text() -> None:
    npl, tl = tpn.TokenEmbedding(5, 3, seed=0), tpt.TokenEmbedding(5, 3)
    h = np.ones((1, 2, 3), np.float32)
    for bad in ([[0, 5]], [[-7, 1]]):
        with pytest.raises(TokenIdError) as a:
            npl.loss(h, bad)
        with pytest.raises(TokenIdError) as b:
            tl.loss(torch.from_numpy(h), torch.tensor(bad))
        assert str(a.value) == str(b.value)
