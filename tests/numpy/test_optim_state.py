"""Optimiser checkpoints: state_dict / load_state_dict / safetensors save and load.

Resuming from a checkpoint must give exactly the run that never stopped; bad checkpoints are refused
with a StateDictError before anything changes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.tables.errors import StateDictError

OPTIMISERS = {
    "adam-lazy": lambda ps: tpn.optim.Adam(ps, lr=1e-2, sparse_mode="lazy"),
    "adamw-exact": lambda ps: tpn.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "sgd-momentum": lambda ps: tpn.optim.SGD(ps, lr=0.1, momentum=0.9),
}
BATCHES = [np.random.default_rng(i).integers(0, 30, size=(2, 5)) for i in range(6)]


def _train(emb, opt, batches):
    for ids in batches:
        opt.zero_grad()
        out = emb(ids)
        emb.backward(np.cos(out))
        opt.step()


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_resuming_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path, name):
    make = OPTIMISERS[name]
    straight = tpn.TransformerEmbedding(30, 8, 16, seed=0)
    opt = make(straight.parameters())
    _train(straight, opt, BATCHES)

    first = tpn.TransformerEmbedding(30, 8, 16, seed=0)
    opt1 = make(first.parameters())
    _train(first, opt1, BATCHES[:3])
    first.save(tmp_path / "model.safetensors")
    opt1.save(tmp_path / "optim.safetensors")

    resumed = tpn.TransformerEmbedding(30, 8, 16, seed=1)             # different weights until loaded
    opt2 = make(resumed.parameters())
    resumed.load(tmp_path / "model.safetensors")
    opt2.load(tmp_path / "optim.safetensors")
    assert opt2.step_count == 3
    _train(resumed, opt2, BATCHES[3:])
    for (key, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=key)


def test_state_dict_keys_and_copies():
    emb = tpn.TokenEmbedding(10, 4, seed=0)
    opt = tpn.optim.Adam(emb.parameters(), lr=1e-2)
    assert opt.state_dict() == {"step_count": 0}
    _train(emb, opt, [np.array([1, 2, 2])])
    state = opt.state_dict()
    assert sorted(state) == ["0.m", "0.step", "0.v", "step_count"]
    assert state["0.step"] == 1 and state["0.m"].shape == (10, 4)
    state["0.m"][...] = 123.0                                          # a copy: the optimiser is unaffected
    assert not np.any(opt.state_dict()["0.m"] == 123.0)


@pytest.mark.parametrize("bad, match", [
    ({"0.m": np.zeros((10, 4), np.float32)}, "step_count"),
    ({"step_count": np.int64(1), "0.x": np.zeros((10, 4), np.float32)}, "'0.x' is not expected"),
    ({"step_count": np.int64(1), "3.m": np.zeros((10, 4), np.float32)}, "'3.m' is not expected"),
    ({"step_count": np.int64(1), "0.m": np.zeros((9, 4), np.float32)}, r"shape \(9, 4\).*expected shape \(10, 4\)"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float64)}, "dtype float64.*dtype float32"),
])
def test_bad_checkpoints_are_refused_and_change_nothing(bad, match):
    emb = tpn.TokenEmbedding(10, 4, seed=0)
    opt = tpn.optim.Adam(emb.parameters(), lr=1e-2)
    _train(emb, opt, [np.array([1, 2, 2])])
    before = opt.state_dict()
    with pytest.raises(StateDictError, match=match):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert sorted(before) == sorted(after)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])


@pytest.mark.parametrize("bad, match", [
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32)},
     r"incomplete: has \['m'\], missing \['step', 'v'\]"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32), "0.v": np.zeros((10, 4), np.float32)},
     r"missing \['step'\]"),
    ({"step_count": np.int64(2), "0.m": np.zeros((10, 4), np.float32), "0.v": np.zeros((10, 4), np.float32),
      "0.step": np.int64(-1)}, "'0.step' is -1; expected a count >= 0"),
    ({"step_count": np.int64(-3)}, "'step_count' is -3; expected a count >= 0"),
    ({"step_count": np.float64(1.0)}, "'step_count' must be an integer scalar"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32), "0.v": np.zeros((10, 4), np.float32),
      "0.step": np.float32(1.0)}, "'0.step' must be an integer scalar"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32), "0.v": np.zeros((10, 4), np.float32),
      "0.step": np.int64(5)}, "'0.step' is 5, more than step_count 1"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32), "0.v": -np.ones((10, 4), np.float32),
      "0.step": np.int64(1)}, "'0.v' has negative entries"),
    ({"step_count": np.int64(1), "0.m": np.zeros((10, 4), np.float32), "0.v": np.full((10, 4), np.nan, np.float32),
      "0.step": np.int64(1)}, r"'0.v' has non-finite entries \(NaN or inf\)"),      # NaN passed the >= 0 test
    ({"step_count": np.int64(1), "0.m": np.full((10, 4), np.inf, np.float32), "0.v": np.zeros((10, 4), np.float32),
      "0.step": np.int64(1)}, "'0.m' has non-finite entries"),
    ("not a dict", "a state_dict must be a dict of arrays, got str"),
])
def test_a_partial_or_negative_state_is_refused_whole_before_anything_changes(bad, match):
    emb = tpn.TokenEmbedding(10, 4, seed=0)
    opt = tpn.optim.Adam(emb.parameters(), lr=1e-2)
    _train(emb, opt, [np.array([1, 2, 2])])
    before, weight = opt.state_dict(), emb.weight.data.copy()
    with pytest.raises(StateDictError, match=match):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert sorted(before) == sorted(after)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])
    _train(emb, opt, [np.array([3])])                              # still trains: no NaN, no KeyError
    assert np.all(np.isfinite(emb.weight.data)) and not np.array_equal(emb.weight.data, weight)


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "numpy"])
@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_a_step_after_resize_raises_without_moving_counters_or_weights(name, kernels):
    import tokenpos

    emb = tpn.TokenEmbedding(10, 4, seed=0)
    opt = OPTIMISERS[name](emb.parameters())
    tokenpos.set_kernels(kernels)
    try:
        _train(emb, opt, [np.array([1, 2, 2]), np.array([3, 4])])
        emb.resize(12)
        opt.zero_grad()
        emb.backward(np.ones_like(emb(np.array([11, 1]))))
        before, weight = opt.state_dict(), emb.weight.data.copy()
        with pytest.raises(StateDictError, match=r"parameter 0 now has shape \(12, 4\).*create a new optimiser"):
            opt.step()
        assert opt.step_count == 2
        after = opt.state_dict()
        for key in before:
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
        np.testing.assert_array_equal(emb.weight.data, weight)
        fresh = OPTIMISERS[name](emb.parameters())                 # the documented way on
        fresh.step()
        assert fresh.step_count == 1 and not np.array_equal(emb.weight.data, weight)
    finally:
        tokenpos.set_kernels(True)


def test_optimizer_checkpoint_files_are_checked_like_layer_files(tmp_path):
    emb = tpn.TokenEmbedding(10, 4, seed=0)
    opt = tpn.optim.Adam(emb.parameters(), lr=1e-2)
    emb.save(tmp_path / "emb.safetensors")
    with pytest.raises(StateDictError, match="emb.safetensors' holds a TokenEmbedding state; expected a file saved "
                                             "by Adam"):
        opt.load(tmp_path / "emb.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(StateDictError, match="junk.safetensors' cannot be read as a safetensors file"):
        opt.load(tmp_path / "junk.safetensors")
    with pytest.raises(StateDictError, match="missing.safetensors' does not exist"):
        opt.load(tmp_path / "missing.safetensors")
