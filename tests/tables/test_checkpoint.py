"""tables.checkpoint: broken checkpoint files give StateDictError naming the file; class metadata is checked.

Every case runs through both backends' ``load`` (NumPy ``Module.load`` and torch ``TokenposModule.load``).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.tables.checkpoint import class_names
from tokenpos.tables.errors import StateDictError

tpt = pytest.importorskip("tokenpos.torch")


def _np(value) -> np.ndarray:
    return value.detach().numpy() if hasattr(value, "detach") else np.asarray(value)


def _layers(name: str, *args: int):
    return [getattr(tpn, name)(*args, seed=1), getattr(tpt, name)(*args, seed=1)]


def _good(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    tpn.TokenEmbedding(10, 4, seed=0).save(path)
    return path


def _truncated(tmp_path: Path) -> Path:
    data = _good(tmp_path).read_bytes()
    path = tmp_path / "truncated.safetensors"
    path.write_bytes(data[: len(data) - 7])
    return path


def _corrupt_header(tmp_path: Path) -> Path:
    data = bytearray(_good(tmp_path).read_bytes())
    data[10:20] = b"\xff" * 10
    path = tmp_path / "corrupt.safetensors"
    path.write_bytes(bytes(data))
    return path


def _random(tmp_path: Path) -> Path:
    path = tmp_path / "random.safetensors"
    path.write_bytes(np.random.default_rng(0).bytes(512))
    return path


def _pickle(tmp_path: Path) -> Path:
    path = tmp_path / "pickled.safetensors"
    path.write_bytes(pickle.dumps({"weight": np.zeros((10, 4), np.float32)}))
    return path


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("make", [_truncated, _corrupt_header, _random, _pickle, _empty])
def test_a_broken_checkpoint_is_a_state_dict_error_naming_the_file(tmp_path, make):
    path = make(tmp_path)
    for layer in _layers("TokenEmbedding", 10, 4):
        before = {k: _np(v).copy() for k, v in layer.state_dict().items()}
        with pytest.raises(StateDictError, match=f"checkpoint '{path}' cannot be read as a safetensors file"):
            layer.load(path)
        for key, value in layer.state_dict().items():
            np.testing.assert_array_equal(_np(value), before[key])


def test_a_missing_path_or_a_directory_is_a_state_dict_error(tmp_path):
    for layer in _layers("TokenEmbedding", 10, 4):
        with pytest.raises(StateDictError, match=f"checkpoint '{tmp_path / 'nope.safetensors'}' does not exist"):
            layer.load(tmp_path / "nope.safetensors")
        with pytest.raises(StateDictError, match="is a directory"):
            layer.load(tmp_path)


def test_a_file_of_another_class_is_refused_even_when_the_keys_fit(tmp_path):
    path = tmp_path / "token.safetensors"
    tpt.TokenEmbedding(10, 4, seed=0).save(path)               # key "weight" (10, 4), as a learned table's
    for layer in _layers("LearnedPositionalEmbedding", 10, 4):
        with pytest.raises(StateDictError, match="holds a TokenEmbedding state; expected a file saved by "
                                                 "LearnedPositionalEmbedding"):
            layer.load(path)
    for layer in _layers("TokenEmbedding", 10, 4):             # the right class, either backend: loads
        layer.load(path)
        np.testing.assert_array_equal(_np(layer.state_dict()["weight"]),
                                      tpn.TokenEmbedding(10, 4, seed=0).weight.data)


def test_older_files_without_metadata_still_load(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "old.safetensors"
    weight = np.arange(40, dtype=np.float32).reshape(10, 4)
    save_file({"weight": weight}, str(path))
    for layer in _layers("LearnedPositionalEmbedding", 10, 4):
        layer.load(path)
        np.testing.assert_array_equal(_np(layer.state_dict()["weight"]), weight)


def test_class_names_accept_base_classes_only():
    class Mine(tpn.TokenEmbedding):
        pass

    assert "TokenEmbedding" in class_names(Mine(10, 4))
    assert "Mine" not in class_names(tpn.TokenEmbedding(10, 4))
