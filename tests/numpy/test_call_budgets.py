"""The light-call budgets of the NumPy backend (the table and its rule: ``tests/call_budgets.py``), and the light
paths held to the general ones (same bits, same errors). Every call still keeps what its ``backward`` needs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import tokenpos
import tokenpos.numpy as tpn
from tests.call_budgets import BUDGETS, K_SHAPE, Q_SHAPE, D, P, V, assert_within_budget
from tokenpos.analysis.calls import trace_call
from tokenpos.numpy._rotary_base import RotaryBase
from tokenpos.tables.errors import TokenIdError


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(0, V, (4, 1))            # int64


def _transformer() -> Callable[[], object]:
    layer = tpn.TransformerEmbedding(V, D, P, positional="learned", seed=0).eval()
    ids = _ids()
    return lambda: layer(ids, start_pos=7)


def _token() -> Callable[[], object]:
    layer = tpn.TokenEmbedding(V, D, seed=0)
    ids = _ids()
    return lambda: layer(ids)


def _qk() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal(Q_SHAPE, dtype=np.float32), rng.standard_normal(K_SHAPE, dtype=np.float32)


def _rope() -> Callable[[], object]:
    layer = tpn.RotaryEmbedding(128, max_seq_len=4096)
    q, k = _qk()
    return lambda: layer.apply(q, k, start_pos=7)


pytestmark = pytest.mark.usefixtures("library_sizes")   # the calls as a user makes them: the library's sizes
CALLS = {"TransformerEmbedding": _transformer, "TokenEmbedding": _token, "RotaryEmbedding.apply": _rope}


@pytest.mark.slow  # traces every call
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_decode_sized_call_fits_its_budget(name: str) -> None:
    with tokenpos.use_kernels(True):
        assert_within_budget(name, CALLS[name]())


def test_the_default_rope_call_is_the_layer_then_the_op() -> None:
    """A reader follows q from ``apply`` to the kernel: the layer's own file, its rows, the layout view, then
    the op's entry and the compiled pass; nothing of the general protocol (given positions, packed rows, key
    positions), of the frequency variant or of the checked kernel API (which validates and copies) on the way."""
    with tokenpos.use_kernels(True):
        trace = trace_call(_rope())
    entered = set(trace.functions)
    assert {"numpy/rotary.py:RotaryEmbedding.apply", "numpy/rotary.py:RotaryEmbedding._rows",
            "numpy/_rotary_base.py:to_bhld", "numpy/functional/rope.py:rope_qk_forward",
            "kernels/rope.py:run_rope"} <= entered, entered
    assert not any(".RotaryBase." in f or "_tables" in f or "_cover" in f or "rope_variant" in f
                   or "freeze_rope_scaling" in f for f in entered), entered
    assert {f for f in entered if f.startswith("kernels/")} == {"kernels/rope.py:run_rope"}, entered


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_light_rope_call_is_the_general_one(kernel_mode: bool, dtype, layout: str) -> None:
    """The default call and the general protocol (``RotaryBase.apply``) give the same bits, forward and
    backward, keep the same shapes, and read the same table rows (before and after the cache grows)."""
    rng = np.random.default_rng(1)
    light, general = (tpn.RotaryEmbedding(16, max_seq_len=8, qk_layout=layout) for _ in range(2))
    q_shape, k_shape = ((2, 4, 3, 16), (2, 2, 3, 16)) if layout == "bhld" else ((2, 3, 4, 16), (2, 3, 2, 16))
    for start in (0, 5, 30, 5, 200):                           # 30: the cache grows; 200: far out, computed
        q, k = rng.standard_normal(q_shape).astype(dtype), rng.standard_normal(k_shape).astype(dtype)
        got = light.apply(q, k, start_pos=start)
        want = RotaryBase.apply(general, q, k, start_pos=start)
        gq, gk = rng.standard_normal(q_shape).astype(dtype), rng.standard_normal(k_shape).astype(dtype)
        for a, b in zip(got + light.backward(gq, gk), want + general.backward(gq, gk), strict=True):
            assert a is not None and b is not None
            assert a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
            assert a.tobytes() == b.tobytes()
        kept, general_kept = light._last, general._last
        assert kept is not None and general_kept is not None
        assert (kept.q_shape, kept.k_shape) == (general_kept.q_shape, general_kept.k_shape)



@pytest.mark.parametrize("bad", [50, -1])
def test_a_bad_id_on_the_light_path_is_still_named_and_changes_nothing(bad: int) -> None:
    """The int64 ids of the light path are read by one reduction; a bad one takes the shared check and its
    TokenIdError (the first bad id, its index), before anything is kept or drawn."""
    layer = tpn.TransformerEmbedding(50, 8, 16, dropout=0.5, seed=0)       # training: a seed would be drawn
    token = tpn.TokenEmbedding(50, 8, seed=0)
    layer(np.array([[3], [4]]), start_pos=7)
    token(np.array([[3], [4]]))
    before = (layer.state_dict(), layer._cache, layer._rng.bit_generator.state, token._cache)
    ids = np.array([[3], [bad]])
    message = rf"^token id {bad} at index \(1, 0\) is out of range \[0, 50\)"
    with pytest.raises(TokenIdError, match=message):
        layer(ids, start_pos=7)
    with pytest.raises(TokenIdError, match=message):
        token(ids)
    state, cache, rng, token_cache = before
    assert all(np.array_equal(v, layer.state_dict()[k]) for k, v in state.items())
    assert layer._cache is cache and token._cache is token_cache and layer._rng.bit_generator.state == rng


@pytest.mark.parametrize("ids", [np.array([[3, 7], [4, 49]]), np.array([[3, 7], [4, 49]], np.int32),
                                 [[3, 7], [4, 49]], np.array([[3, 7], [4, 49]])[:, ::-1]])
def test_every_kind_of_ids_gives_the_same_rows(kernel_mode: bool, ids) -> None:
    """int64 arrays (the light check), other integer dtypes, lists and strided views (the shared check)."""
    layer = tpn.TransformerEmbedding(50, 8, 16, seed=0)
    layer.eval()
    want = layer(np.array(ids, dtype=np.int64), start_pos=3)
    got = layer(ids, start_pos=3)
    cache = layer._cache
    assert cache is not None and cache.embedding.ids.dtype == np.int64 and got.tobytes() == want.tobytes()
