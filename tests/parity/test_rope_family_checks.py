"""Both backends' RoPE-family layers accept and refuse the same settings with the same messages (shared checks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenpos.numpy.rope2d import RotaryEmbedding2D as NpRope2D
from tokenpos.numpy.xpos import XPosRotaryEmbedding as NpXPos
from tokenpos.tables import ConfigError, PositionError
from tokenpos.torch.rope2d import RotaryEmbedding2D as TRope2D
from tokenpos.torch.xpos import XPosRotaryEmbedding as TXPos


def test_xpos_arguments():
    for layer in (NpXPos, TXPos):
        built = layer(8, rotary_dim=4, scale_base=256, center=3, interleaved=False)
        assert (built.rotary_dim, built.scale_base, built.center, built.interleaved) == (4, 256.0, 3.0, False)
        with pytest.raises(ConfigError, match="interleaved must be True or False, got 1"):
            layer(8, interleaved=1)
        with pytest.raises(ConfigError, match="rotary_dim must be an even number"):
            layer(8, rotary_dim=3)


class _Cfg:
    hidden_size, num_attention_heads = 64, 4

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_rope2d_from_hf_config():
    for layer in (NpRope2D, TRope2D):
        built = layer.from_hf_config(_Cfg(rope_parameters={"rope_theta": 7.0}))
        assert (built.head_dim, built.base) == (16, 7.0)
        with pytest.raises(ConfigError, match="2-D RoPE reads rope_parameters"):
            layer.from_hf_config(_Cfg(rope_parameters={"rope_type": "default"}))


def test_rope2d_bad_positions_same_message():
    q = np.zeros((2, 1, 3, 8))
    messages = []
    for layer, x in ((NpRope2D(8), q), (TRope2D(8), torch.from_numpy(q))):
        with pytest.raises(ConfigError) as err:
            layer.apply(x, x, np.zeros((4, 2), dtype=np.int64))
        messages.append(str(err.value))
    assert messages[0] == messages[1] == "positions must have shape (3, 2) or (2, 3, 2), got (4, 2)"


# -- start_pos with positions: refused alike by every RoPE family of both backends ----------------

_RNG = np.random.default_rng(5)
_Q, _K_LONG = _RNG.standard_normal((2, 2, 5, 8)), _RNG.standard_normal((2, 2, 7, 8))
START_POS_CASES = {   # name: (layer class name, kwargs, positions of the 5 queries, whether start_pos=None is accepted)
    "rope": ("RotaryEmbedding", {"max_seq_len": 16}, np.array([3, 0, 7, 7, 1]), False),
    "rope-BL": ("RotaryEmbedding", {"max_seq_len": 16}, _RNG.integers(0, 20, (2, 5)), False),
    "mrope": ("MRotaryEmbedding", {"mrope_section": [2, 1, 1]}, _RNG.integers(0, 20, (3, 2, 5)), False),
    "xpos": ("XPosRotaryEmbedding", {"scale_base": 16.0}, np.array([0, 3, 4, 9, 12]), False),
    "rope2d": ("RotaryEmbedding2D", {}, _RNG.integers(0, 6, (5, 2)), True),
}
START_POS_METHODS = {   # method: the layers that have it (xPos's torch rotate always refuses, for another reason)
    "apply": tuple(START_POS_CASES),
    "apply-kv": ("rope", "rope-BL", "mrope"),          # keys at their own positions (a KV cache)
    "apply_forward": tuple(START_POS_CASES),           # NumPy only
    "rotate": ("rope", "rope-BL", "mrope", "rope2d"),  # torch: all four; NumPy: RoPE
}


def _start_pos_layers(name: str) -> list[tuple[object, object]]:
    import tokenpos.numpy as tpn
    import tokenpos.torch as tpt

    cls, kw, _, _ = START_POS_CASES[name]
    return [(getattr(tpn, cls)(8, **kw), np.asarray), (getattr(tpt, cls)(8, **kw), torch.from_numpy)]   # NumPy, torch


def _start_pos_call(layer, method: str, name: str, conv):
    pos, q = conv(START_POS_CASES[name][2]), conv(_Q)
    if method == "apply":
        return lambda **kw: layer.apply(q, q * 0.5, pos, **kw)
    if method == "apply-kv":
        return lambda **kw: layer.apply(q, conv(_K_LONG), pos, key_positions=conv(np.arange(7)), **kw)
    if method == "apply_forward":
        return lambda **kw: layer.apply_forward(q, q * 0.5, pos, **kw)[:2]
    return lambda **kw: layer.rotate(q, pos, **kw)


@pytest.mark.parametrize("name, method", [(n, m) for m, names in START_POS_METHODS.items() for n in names])
def test_start_pos_with_positions_is_refused_alike_and_changes_nothing(name: str, method: str) -> None:
    """Given positions are used as they are, so a nonzero start_pos would be ignored: a ConfigError with
    the same text in both backends, raised before a layer keeps anything for backward; start_pos=0 (and
    None for 2-D RoPE, whose default it is) gives the call without it."""
    none_ok, messages = START_POS_CASES[name][3], []
    for layer, conv in _start_pos_layers(name):
        if not hasattr(layer, method.split("-")[0]):                     # e.g. apply_forward is NumPy's
            continue
        call = _start_pos_call(layer, method, name, conv)
        default = call()
        last = getattr(layer, "_last", None)                            # NumPy: the backward cache of apply
        with pytest.raises(ConfigError) as err:
            call(start_pos=3)
        messages.append(str(err.value))
        assert getattr(layer, "_last", None) is last
        for zero in (0, np.int64(0)) + ((None,) if none_ok else ()):
            got = call(start_pos=zero)
            for a, b in zip(got if isinstance(got, tuple) else (got,), default if isinstance(default, tuple)
                            else (default,), strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    expected = "start_pos=None or 0" if none_ok else "start_pos=0"
    assert messages and set(messages) == {f"start_pos=3 given with positions: positions are used as given, so "
                                          f"start_pos would be ignored; expected {expected} (add the offset to "
                                          f"positions instead)"}


# -- 1-D positions: one helper (RotaryBase._positions / _qk_positions), the same refusals everywhere ----------

_Q5, _K7 = _RNG.standard_normal((2, 2, 5, 8)), _RNG.standard_normal((2, 2, 7, 8))
BAD_POSITIONS = {   # name: (q, k, apply's arguments), each refused alike by RoPE and xPos of both backends
    "positions-length": (_Q5, _Q5, {"positions": np.arange(4)}),
    "positions-batch": (_Q5, _Q5, {"positions": np.zeros((3, 5), dtype=np.int64)}),
    "positions-rank": (_Q5, _Q5, {"positions": np.zeros((1, 2, 5), dtype=np.int64)}),
    "positions-negative": (_Q5, _Q5, {"positions": np.array([0, 1, -2, 3, 4])}),
    "positions-float": (_Q5, _Q5, {"positions": np.arange(5.0)}),
    "start_pos-negative": (_Q5, _Q5, {"start_pos": -1}),
    "start_pos-float": (_Q5, _Q5, {"start_pos": 1.5}),
    "start_pos-overflow": (_Q5, _Q5, {"start_pos": 2 ** 63 - 3}),
    "k-length": (_Q5, _K7, {}),
    "k-length-before-positions": (_Q5, _K7, {"positions": np.arange(4)}),     # the lengths are checked first
    "key_positions-length": (_Q5, _K7, {"key_positions": np.arange(6)}),
    "key_positions-negative": (_Q5, _K7, {"key_positions": np.arange(7) - 1}),
    "key_positions-after-positions": (_Q5, _K7, {"positions": np.arange(4), "key_positions": np.arange(6)}),
}


@pytest.mark.parametrize("case", sorted(BAD_POSITIONS))
def test_rope_and_xpos_refuse_bad_positions_alike_in_both_backends(case: str) -> None:
    """RoPE and xPos read their 1-D positions through one helper of the rotary base class (``_positions``,
    ``_qk_positions``), so each bad call gets the same error type and text from all four layers, and a
    NumPy layer keeps nothing for backward."""
    import tokenpos.numpy as tpn
    import tokenpos.torch as tpt

    q, k, kwargs = BAD_POSITIONS[case]
    got = set()
    for module, conv in ((tpn, np.asarray), (tpt, torch.from_numpy)):
        for layer in (module.RotaryEmbedding(8, max_seq_len=16), module.XPosRotaryEmbedding(8)):
            last = getattr(layer, "_last", None)
            with pytest.raises((ConfigError, PositionError)) as err:
                layer.apply(conv(q), conv(k), **{n: conv(v) if isinstance(v, np.ndarray) else v
                                                 for n, v in kwargs.items()})
            assert getattr(layer, "_last", None) is last
            got.add((type(err.value).__name__, str(err.value)))
    assert len(got) == 1, got
