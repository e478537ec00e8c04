"""A RotaryEmbedding shared by threads never rotates with another call's frequencies (torch backend).

Same contract as tests/numpy/test_rotary_threads.py: longrope results equal the serial ones; dynamic
NTK results equal the rotation of one state a serial order could have reached. Kernels on and off,
``positions=None`` and explicit positions.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos
from tests.tolerances import TOL
from tokenpos.tables import ConfigError, rope_inv_freq
from tokenpos.tables.formulas.rope import rope_cos_sin, rope_rotate
from tokenpos.torch import RotaryEmbedding

DH, MAX = 8, 16
SCALINGS = {
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 5.0, 7.0, 9.0],
                 "original_max_position_embeddings": 12},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}


def _call(rope: RotaryEmbedding, x: torch.Tensor, explicit: bool) -> torch.Tensor:
    if explicit:
        q, _ = rope.apply(x, x, torch.arange(x.shape[2]))
        return q
    return rope.rotate(x)


def _threaded(rope: RotaryEmbedding, xs: list[torch.Tensor], explicit: bool) -> list[torch.Tensor]:
    barrier = threading.Barrier(4)

    def call(i: int) -> torch.Tensor:
        if i < 4:
            barrier.wait()
        return _call(rope, xs[i], explicit)

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(call, range(len(xs))))


def _dynamic_candidates(x: torch.Tensor, lengths: list[int]) -> list[np.ndarray]:
    n = x.shape[2]
    out = []
    for s in sorted({MAX, *(m for m in lengths if m >= n)}):
        inv, _ = rope_inv_freq(DH, scaling=SCALINGS["dynamic"], max_position_embeddings=MAX, seq_len=s)
        cos, sin = rope_cos_sin(np.arange(n), inv)
        out.append(rope_rotate(x.numpy(), cos, sin))
    return out


@pytest.mark.slow  # threads
@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("name", ["longrope", "dynamic"])
@settings(max_examples=6, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=8, max_size=20))
def test_shared_layer_under_threads_equals_serial(name: str, kernels: bool, explicit: bool,
                                                  lengths: list[int]) -> None:
    previous = tokenpos.kernels_enabled()
    tokenpos.set_kernels(kernels)
    try:
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(1, 2, n, DH, dtype=torch.float64, generator=g) for n in lengths]
        got = _threaded(RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name]), xs, explicit)
        if name == "longrope":
            serial = RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name])
            for x, out in zip(xs, got, strict=True):
                np.testing.assert_allclose(out.numpy(), _call(serial, x, explicit).numpy(), **TOL["forward.float64"])
            return
        for x, out in zip(xs, got, strict=True):
            errs = [float(np.abs(out.numpy() - c).max()) for c in _dynamic_candidates(x, lengths)]
            assert min(errs) <= 1e-12, f"length {x.shape[2]}: no consistent frequency state, errors {errs}"
    finally:
        tokenpos.set_kernels(previous)


def test_integer_and_bool_inputs_are_refused() -> None:
    rope = RotaryEmbedding(DH)
    for dtype in (torch.int64, torch.int32, torch.bool):
        x = torch.ones(1, 1, 3, DH, dtype=dtype)
        name = str(dtype).replace("torch.", "")
        with pytest.raises(ConfigError, match=f"q must be a floating-point array.*got dtype {name}"):
            rope.apply(x, x)
        with pytest.raises(ConfigError, match="x must be a floating-point array"):
            rope.rotate(x)


def test_deepcopy_keeps_a_working_lock() -> None:
    rope = RotaryEmbedding(DH, scaling=SCALINGS["dynamic"], max_seq_len=MAX)
    twin = copy.deepcopy(rope)
    x = torch.randn(1, 1, 5, DH)
    torch.testing.assert_close(twin.rotate(x), rope.rotate(x), rtol=0, atol=0)
    assert twin._lock is not rope._lock
