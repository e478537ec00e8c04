"""Bad input to TransformerEmbedding is reported the same way by both backends, kernels on and off.

The layers leave the ids' value check to the embedding op when nothing changes before it (the
kernel checks inside its gather loop, any other path first). These cases pin what that must not
change: a bad id is reported before any other bad input, the kernel choice and the check cannot be
separated by a concurrent ``tokenpos.set_kernels``, ``start_pos`` is checked on every call (not
only when a cached position array is missed), out-of-range positions are refused even for an
empty batch, and nothing (parameters, RNG) changes when a call raises.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.tables.errors import ConfigError, PositionError, TokenIdError

BACKENDS = ("numpy", "torch")
KERNELS = pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])


def _layer(backend: str, **kw):
    kw.setdefault("seed", 0)
    cls = tpn.TransformerEmbedding if backend == "numpy" else tpt.TransformerEmbedding
    return cls(10, 8, kw.pop("max_seq_len", 8), **kw)


def _ids(backend: str, rows):
    arr = np.asarray(rows, dtype=np.int64)
    return arr if backend == "numpy" else torch.from_numpy(arr)


def _rng_state(backend: str, layer):
    return layer._rng.bit_generator.state if backend == "numpy" else torch.get_rng_state()


@pytest.mark.parametrize("backend", BACKENDS)
@KERNELS
@pytest.mark.parametrize("call", [
    pytest.param({"start_pos": 6}, id="positions past the table"),
    pytest.param({"positions": [0, 1, 99]}, id="given positions past the table"),
    pytest.param({"start_pos": -1}, id="negative start_pos"),
    pytest.param({"positions": [0, 1, 2], "start_pos": 3}, id="start_pos with positions"),
])
def test_a_bad_id_is_reported_before_a_bad_position(backend, kernels, call):
    layer = _layer(backend).eval()
    ids = _ids(backend, [[1, -1, 3]])
    if "positions" in call:
        call = {**call, "positions": _ids(backend, call["positions"])}
    with tokenpos.use_kernels(kernels), pytest.raises(TokenIdError, match="token id -1 at index"):
        layer(ids, **call)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [True, 1.0, np.int64(1).astype(float)], ids=["True", "1.0", "np float"])
def test_start_pos_is_checked_on_every_call_not_only_on_a_cache_miss(backend, bad):
    layer = _layer(backend).eval()
    ids = _ids(backend, [[1, 2, 3]])
    layer(ids, start_pos=1)                                  # fills the shared positions of (L=3, start 1)
    with pytest.raises(ConfigError, match="start_pos must be an integer"):
        layer(ids, start_pos=bad)


@pytest.mark.parametrize("backend", BACKENDS)
@KERNELS
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_positions_past_the_table_are_refused_for_an_empty_batch_and_change_nothing(backend, kernels, p):
    layer = _layer(backend, max_seq_len=6, dropout=p).train(p > 0)
    ids = _ids(backend, np.zeros((0, 3), np.int64))
    before = _rng_state(backend, layer)
    with tokenpos.use_kernels(kernels), pytest.raises(PositionError, match="position 6 at index"):
        layer(ids, start_pos=4)                              # positions 4, 5, 6 of a 6-row table
    after = _rng_state(backend, layer)
    assert (after == before) if backend == "numpy" else torch.equal(after, before)


@KERNELS
def test_sinusoidal_padding_positions_past_the_table_agree_across_backends(kernels):
    """RoBERTa-style positions (padding_idx + 1 + count) may run past a sinusoidal table; the formula
    is defined there, so both backends compute those rows instead of refusing them."""
    kw = dict(positional="sinusoidal", padding_idx=2, position_ids="padding", max_seq_len=8)
    ids = [[3, 4, 5, 6, 7, 8]]                               # positions 3..8: the last one past the table
    with tokenpos.use_kernels(kernels):
        out_np = _layer("numpy", **kw).eval()(_ids("numpy", ids))
        out_t = _layer("torch", **kw).eval()(_ids("torch", ids))
    np.testing.assert_allclose(out_t.detach().numpy(), out_np, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # threads racing set_kernels
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_concurrent_set_kernels_cannot_skip_the_id_check(backend):
    """One thread flips the kernel switch while another calls with a bad id: every call raises (a
    check decided before the kernel choice could otherwise let -1 wrap around to the last row)."""
    layer = _layer(backend).eval()
    ids = _ids(backend, [[-1, 2, 3]])
    was, stop = tokenpos.kernels_enabled(), threading.Event()

    def flip() -> None:
        on = True
        while not stop.is_set():
            on = not on
            tokenpos.set_kernels(on)

    flipper = threading.Thread(target=flip)
    flipper.start()
    accepted = 0
    try:
        for _ in range(3000):
            try:
                layer(ids)
                accepted += 1
            except TokenIdError:
                pass
    finally:
        stop.set()
        flipper.join()
        tokenpos.set_kernels(was)
    assert accepted == 0


CONFIGS = {
    "learned": {},
    "learned, RoBERTa padding positions": {"padding_idx": 1, "position_ids": "padding"},
    "sinusoidal": {"positional": "sinusoidal"},
    "sinusoidal past the table": {"positional": "sinusoidal", "max_seq_len": 2},
    "rope": {"positional": "rope", "num_heads": 2},
    "none": {"positional": "none"},
    "layernorm": {"norm": "layernorm"},
    "token types": {"num_token_types": 2},
    "scaled, padding row": {"scale": True, "padding_idx": 0},
}


@pytest.mark.parametrize("backend", BACKENDS)
@KERNELS
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("bad", [-1, 10], ids=["negative", "V"])
def test_every_block_refuses_a_bad_id_with_the_shared_error(backend, kernels, config, bad):
    """Whichever op sequence the block runs (one fused op, or token rows then positions, norm, types),
    a bad id raises TokenIdError, kernels on and off, in both backends (never a wrapped row, never a
    bare IndexError from the plain path)."""
    layer = _layer(backend, **CONFIGS[config]).eval()
    with tokenpos.use_kernels(kernels), pytest.raises(TokenIdError, match=f"token id {bad} at index"):
        layer(_ids(backend, [[2, bad, 3]]))


@pytest.mark.parametrize("backend", BACKENDS)
@KERNELS
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_a_bad_id_in_training_leaves_the_dropout_generator_alone(backend, kernels, config):
    """With dropout the seed is drawn after every input has been checked: a call with a bad id
    raises before drawing, so the generator is where it was and the next good call draws the seed
    it would have drawn."""
    def make():
        return _layer(backend, dropout=0.5, **CONFIGS[config]).train()

    layer, twin = make(), make()
    good = _ids(backend, [[2, 4, 3]])
    before = _rng_state(backend, layer)
    with tokenpos.use_kernels(kernels):
        with pytest.raises(TokenIdError, match="token id 10 at index"):
            layer(_ids(backend, [[2, 10, 3]]))
        after = _rng_state(backend, layer)
        assert (after == before) if backend == "numpy" else torch.equal(after, before)
        out = layer(good)
        if backend == "torch":                  # torch's layers share the global generator: rewind it
            torch.set_rng_state(before)
        expected = twin(good)
    if backend == "torch":
        out, expected = out.detach().numpy(), expected.detach().numpy()
    np.testing.assert_array_equal(out, expected)


def test_a_bad_id_in_training_leaves_an_explicit_torch_generator_alone():
    gen = torch.Generator().manual_seed(5)
    layer = tpt.TransformerEmbedding(10, 8, 8, dropout=0.5, generator=gen).train()
    before, global_before = gen.get_state(), torch.get_rng_state()
    with pytest.raises(TokenIdError):
        layer(torch.tensor([[2, -1, 3]]))
    assert torch.equal(gen.get_state(), before) and torch.equal(torch.get_rng_state(), global_before)


@pytest.mark.slow  # threads
@pytest.mark.parametrize("backend", BACKENDS)
def test_failed_and_good_training_calls_from_two_threads(backend):
    """One thread keeps calling with a bad id while another trains on good ids, on one layer and
    one generator: every bad call raises TokenIdError, and every good call succeeds with a seed of
    its own (equal outputs for equal ids would show a seed handed out twice: failing calls never
    draw, so nothing is ever taken back)."""
    layer = _layer(backend, dropout=0.5).train()
    good, bad = _ids(backend, [[1, 2, 3, 4]]), _ids(backend, [[1, 10, 3, 4]])
    outs, errors = [], []

    def failing() -> None:
        for _ in range(300):
            try:
                layer(bad)
                errors.append("accepted a bad id")
            except TokenIdError:
                pass

    thread = threading.Thread(target=failing)
    thread.start()
    try:
        for _ in range(300):
            out = layer(good)
            outs.append((out if backend == "numpy" else out.detach().numpy()).tobytes())
    finally:
        thread.join()
    assert not errors
    assert len(set(outs)) == len(outs)
