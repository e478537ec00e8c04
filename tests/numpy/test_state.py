"""state_dict / load_state_dict and safetensors save / load (never pickle)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.numpy.helpers import Snapshot


def layers():
    return {
        "token": lambda seed: tpn.TokenEmbedding(11, 4, seed=seed, padding_idx=0),
        "learned": lambda seed: tpn.LearnedPositionalEmbedding(6, 4, seed=seed, dtype=np.float64),
        "sinusoidal": lambda seed: tpn.SinusoidalPositionalEncoding(6, 4),
        "layernorm": lambda seed: tpn.LayerNorm(4),
        "transformer": lambda seed: tpn.TransformerEmbedding(11, 4, 6, num_token_types=2, norm="layernorm",
                                                             seed=seed, dtype=np.float16),
    }


KEYS = {
    "token": {"weight"}, "learned": {"weight"}, "sinusoidal": set(), "layernorm": {"weight", "bias"},
    "transformer": {"token.weight", "position.weight", "token_type.weight", "norm.weight", "norm.bias"},
}


@pytest.mark.parametrize("name", list(KEYS))
def test_state_dict_keys_and_copies(name):
    layer = layers()[name](0)
    state = layer.state_dict()
    assert set(state) == KEYS[name]
    for k, v in state.items():
        p = dict(layer.named_parameters())[k]
        assert v.shape == p.shape and v.dtype == p.dtype
        v[...] = 123
        assert not np.any(p.data == 123) or p.data.size == 0, "state_dict returns copies"


@pytest.mark.parametrize("name", list(KEYS))
def test_round_trip_in_memory_and_on_disk(name, tmp_path):
    src, dst = layers()[name](1), layers()[name](2)
    for p in src.parameters():
        p.data[...] = np.random.default_rng(0).standard_normal(p.shape)
    dst.load_state_dict(src.state_dict())
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(dst.state_dict()[k], v)
    other = layers()[name](3)
    path = tmp_path / f"{name}.safetensors"
    src.save(path)
    other.load(path)
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(other.state_dict()[k], v)
        assert other.state_dict()[k].dtype == v.dtype


def test_the_file_is_safetensors_not_pickle(tmp_path):
    from safetensors.numpy import load_file

    layer = layers()["transformer"](0)
    path = tmp_path / "emb.safetensors"
    layer.save(str(path))
    raw = path.read_bytes()
    assert not raw.startswith(b"\x80"), "a pickle stream starts with the PROTO opcode 0x80"
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"]["class"] == "TransformerEmbedding"
    assert header["token.weight"]["dtype"] == "F16" and header["token.weight"]["shape"] == [11, 4]
    loaded = load_file(str(path))
    assert set(loaded) == KEYS["transformer"]


def test_load_also_behaves_the_same():
    a, b = layers()["transformer"](0).eval(), layers()["transformer"](9).eval()
    ids = np.array([[1, 2, 3]])
    assert not np.array_equal(a(ids), b(ids))
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a(ids), b(ids))


def test_load_clears_gradients_of_loaded_parameters():
    layer = layers()["learned"](0)
    layer(3)
    layer.backward(np.ones((3, 4)))
    layer.load_state_dict(layer.state_dict())
    assert layer.weight.grad is None


@pytest.mark.parametrize("key, value, match", [
    ("token.weight", np.zeros((12, 4), np.float16), r"'token.weight'.*shape \(12, 4\), expected \(11, 4\)"),
    ("norm.bias", np.zeros(4, np.float32), r"state_dict\['norm.bias'\].*dtype float32, expected float16"),
    ("position.weight", np.zeros((4, 6), np.float16), r"'position.weight'.*shape \(4, 6\), expected \(6, 4\)"),
])
def test_wrong_shape_or_dtype_is_refused_and_nothing_is_written(key, value, match, tmp_path):
    layer = layers()["transformer"](0)
    layer(np.array([[1, 2]]))
    layer.backward(np.ones((1, 2, 4), np.float16))
    before = Snapshot(layer)
    good = layers()["transformer"](5).state_dict()
    bad = dict(good, **{key: value})               # every other entry would fit and differ
    with pytest.raises(ValueError, match=match) as err:
        layer.load_state_dict(bad)
    assert isinstance(err.value, tpn.StateDictError)
    before.assert_same(Snapshot(layer))
    from safetensors.numpy import save_file

    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(tpn.StateDictError, match=match):
        layer.load(tmp_path / "bad.safetensors")
    before.assert_same(Snapshot(layer))


def test_missing_and_unexpected_keys():
    layer = layers()["transformer"](0)
    before = Snapshot(layer)
    state = layer.state_dict()
    state.pop("norm.bias")
    with pytest.raises(tpn.StateDictError, match=r"missing keys \['norm.bias'\]"):
        layer.load_state_dict(state)
    with pytest.raises(tpn.StateDictError, match=r"unexpected keys \['extra'\]"):
        layer.load_state_dict(dict(layer.state_dict(), extra=np.zeros(1)))
    before.assert_same(Snapshot(layer))
    partial = {"norm.weight": np.full(4, 2.0, np.float16), "extra": np.zeros(1)}
    layer.load_state_dict(partial, strict=False)
    assert layer.norm.weight.data.tolist() == [2.0] * 4


def test_frozen_parameters_are_saved_and_loaded():
    layer = tpn.TokenEmbedding.from_pretrained(np.arange(6.0).reshape(3, 2))
    assert set(layer.state_dict()) == {"weight"}
    layer.load_state_dict({"weight": np.ones((3, 2))})
    assert layer.weight.data.sum() == 6 and not layer.weight.requires_grad


def test_torch_tensors_load():
    torch = pytest.importorskip("torch")
    layer = tpn.TokenEmbedding(3, 2, seed=0)
    layer.load_state_dict({"weight": torch.ones(3, 2)})
    assert layer.weight.data.sum() == 6
    with pytest.raises(tpn.StateDictError, match="bfloat16"):
        layer.load_state_dict({"weight": torch.ones(3, 2, dtype=torch.bfloat16)})
    with pytest.raises(tpn.StateDictError, match="dtype float64, expected float32"):
        layer.load_state_dict({"weight": torch.ones(3, 2, dtype=torch.float64)})


@pytest.mark.parametrize("state", [None, "token.weight", [("token.weight", np.zeros((5, 4)))]])
def test_a_state_that_is_not_a_mapping_is_a_state_dict_error(state: object) -> None:
    """``load_state_dict`` of something that is not a dict raised AttributeError from ``.items()``."""
    from tokenpos.tables import StateDictError

    emb = tpn.TransformerEmbedding(5, 4, 8, seed=0)
    before = emb.state_dict()
    with pytest.raises(StateDictError, match=f"a state_dict must be a dict of arrays, got {type(state).__name__}"):
        emb.load_state_dict(state)  # type: ignore[arg-type]
    for key, value in emb.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_a_negative_seed_is_a_config_error_naming_it() -> None:
    """seed=-1 gave NumPy's bare "expected non-negative integer" ValueError."""
    import torch

    import tokenpos.torch as tpt
    from tokenpos.tables import ConfigError

    for build in (lambda: tpn.TokenEmbedding(5, 4, seed=-1), lambda: tpt.TokenEmbedding(5, 4, seed=-1)):
        with pytest.raises(ConfigError, match="seed must be an integer >= 0 or None, got -1"):
            build()
    assert torch.equal(tpt.TokenEmbedding(5, 4, seed=0).weight, torch.from_numpy(tpn.TokenEmbedding(5, 4, seed=0)
                                                                                   .weight.data))
