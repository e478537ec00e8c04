"""FIRE and KERPLE: NumPy (hand-written backward) against torch (autograd) through the one parity helper."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.parity.helpers import assert_fn_parity  # noqa: E402
from tokenpos.numpy.fire import FIRE as NpFIRE  # noqa: E402
from tokenpos.numpy.kerple import KERPLE as NpKERPLE  # noqa: E402
from tokenpos.torch.fire import FIRE as TFIRE  # noqa: E402
from tokenpos.torch.kerple import KERPLE as TKERPLE  # noqa: E402


def _tdtype(dtype):
    return getattr(torch, np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("lq", "lk", "init_L"), [(5, 5, 3.5), (2, 9, 4.5), (4, 4, 100.0)])
def test_fire_forward_and_gradients(dtype, lq: int, lk: int, init_L: float) -> None:
    np_layer = NpFIRE(3, width=8, init_L=init_L, dtype=dtype, seed=0)
    np_layer.c.data[...] = -0.3                                     # |c| in the listing: any sign works
    t_layer = TFIRE(3, width=8, init_L=init_L, dtype=_tdtype(dtype), seed=1)
    t_layer.load_state_dict(np_layer.state_dict())
    assert_fn_parity(lambda: np_layer(lq, lk), np_layer.backward, lambda: t_layer(lq, lk), (),
                     np_params=dict(np_layer.named_parameters()), torch_params=dict(t_layer.named_parameters()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("lq", "lk"), [(5, 5), (2, 9), (1, 30)])
def test_kerple_forward_and_gradients(dtype, lq: int, lk: int) -> None:
    np_layer = NpKERPLE(4, dtype=dtype, seed=0)
    t_layer = TKERPLE(4, dtype=_tdtype(dtype), seed=1)
    t_layer.load_state_dict(np_layer.state_dict())
    assert_fn_parity(lambda: np_layer(lq, lk), np_layer.backward, lambda: t_layer(lq, lk), (),
                     np_params=dict(np_layer.named_parameters()), torch_params=dict(t_layer.named_parameters()))


def test_same_seed_same_initial_values_in_both_backends() -> None:
    for np_cls, t_cls in ((NpFIRE, TFIRE), (NpKERPLE, TKERPLE)):
        a, b = np_cls(3, dtype=np.float64, seed=7), t_cls(3, dtype=torch.float64, seed=7)
        for name, value in a.state_dict().items():
            np.testing.assert_array_equal(value, b.state_dict()[name].numpy(), err_msg=name)


def test_kerple_projection_matches() -> None:
    np_layer, t_layer = NpKERPLE(2, dtype=np.float64, seed=0), TKERPLE(2, dtype=torch.float64, seed=0)
    np_layer.r1.data[...] = [-1.0, 0.5]
    t_layer.load_state_dict(np_layer.state_dict())
    np.testing.assert_allclose(np_layer(3, 3), t_layer(3, 3).detach().numpy(), rtol=1e-15)
    np.testing.assert_array_equal(t_layer.r1.detach().numpy(), [0.01, 0.5])
