"""A checkpoint of any dtype safetensors holds either loads into a NumPy layer or raises StateDictError.

Guard (issue 28, item 10a): for every public NumPy layer (``tests/numpy/layers.py``) and every dtype
safetensors can store (``tables.checkpoint.SAFETENSORS_DTYPES`` that torch can write: bool, integers,
float16, bfloat16, float32, float64, complex64, float8 ...), a file of the layer's keys in that dtype
(written by safetensors' torch writer) -- and the same tensors given to ``load_state_dict`` -- either
loads exactly (the layer's own dtype) or raises ``StateDictError`` naming the key, the dtype and the
expected dtype, and the layer is unchanged. Never a bare TypeError / AttributeError from NumPy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tokenpos.numpy as tpn
from tests.numpy.layers import SPECS, build
from tokenpos.tables.checkpoint import SAFETENSORS_DTYPES

TORCH_DTYPES = [name for name in SAFETENSORS_DTYPES.values() if hasattr(torch, name)]


def _state(layer: Any, dtype: str) -> dict[str, torch.Tensor]:
    keys = layer.state_dict() or {"weight": np.ones((2, 3), np.float32)}     # parameter-free: one stray key
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(getattr(torch, dtype))
            for k, v in keys.items()}


def test_the_dtype_list_covers_the_hard_cases() -> None:
    assert {"bfloat16", "float16", "int8", "bool", "float8_e4m3fn", "float8_e5m2"} <= set(TORCH_DTYPES)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("name", sorted(SPECS) + ["TokenEmbedding[float16]"])
@pytest.mark.parametrize("via", ["file", "load_state_dict"])
def test_checkpoint_of_every_dtype_loads_or_is_refused(name: str, dtype: str, via: str, tmp_path: Path) -> None:
    layer = tpn.TokenEmbedding(20, 8, dtype=np.float16) if name.endswith("[float16]") else build(name)
    state = _state(layer, dtype)
    before = layer.state_dict()
    if via == "file":
        path = tmp_path / "ck.safetensors"
        save_file(state, str(path))
    fits = bool(before) and all(str(p.dtype) == dtype for _, p in layer.named_parameters(remove_duplicate=False))
    if fits:
        layer.load(path) if via == "file" else layer.load_state_dict(state)
        for k, v in state.items():
            np.testing.assert_array_equal(layer.state_dict()[k], v.numpy())
        return
    with pytest.raises(tpn.StateDictError) as info:
        layer.load(path) if via == "file" else layer.load_state_dict(state)
    message = str(info.value)
    if before:                                            # wrong dtype: the key, the dtype, the expected dtype
        named = [(k, p) for k, p in layer.named_parameters(remove_duplicate=False) if repr(k) in message]
        assert named and dtype in message and str(named[0][1].dtype) in message, message
    else:                                                 # a parameter-free layer: the stray key is named
        assert "weight" in message, message
    after = layer.state_dict()
    assert sorted(after) == sorted(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
