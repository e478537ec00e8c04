"""A RotaryEmbedding shared by threads never rotates with another call's frequencies (NumPy backend).

Length-dependent scalings choose their frequencies per call: longrope by the call's length (so every
threaded result must equal the serial one), dynamic NTK by HF's state (a threaded result must equal
the rotation of one state a serial order could have reached: the original frequencies or those of a
length seen, at least the call's own). Kernels on and off.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos
from tests.tolerances import TOL
from tokenpos.numpy import RotaryEmbedding
from tokenpos.tables import ConfigError, rope_inv_freq
from tokenpos.tables.formulas.rope import rope_cos_sin, rope_rotate

DH, MAX = 8, 16
SCALINGS = {
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 5.0, 7.0, 9.0],
                 "original_max_position_embeddings": 12},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}


def _inputs(lengths: list[int], dtype: type) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 2, n, DH)).astype(dtype) for n in lengths]


def _threaded(rope: RotaryEmbedding, xs: list[np.ndarray]) -> list[np.ndarray]:
    barrier = threading.Barrier(4)

    def call(i: int) -> np.ndarray:
        if i < 4:
            barrier.wait()
        return rope.rotate(xs[i])

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(call, range(len(xs))))


def _dynamic_candidates(x: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    n = x.shape[2]
    out = []
    for s in sorted({MAX, *(m for m in lengths if m >= n)}):
        inv, _ = rope_inv_freq(DH, scaling=SCALINGS["dynamic"], max_position_embeddings=MAX, seq_len=s)
        cos, sin = rope_cos_sin(np.arange(n), inv)
        out.append(rope_rotate(x.astype(np.float64), cos, sin))
    return out


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("name", ["longrope", "dynamic"])
@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=8, max_size=24))
def test_shared_layer_under_threads_equals_serial(kernels: bool, name: str, lengths: list[int]) -> None:
    previous = tokenpos.kernels_enabled()
    tokenpos.set_kernels(kernels)
    try:
        xs = _inputs(lengths, np.float64)
        got = _threaded(RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name]), xs)
        if name == "longrope":
            serial = RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name])
            for x, g in zip(xs, got, strict=True):
                np.testing.assert_allclose(g, serial.rotate(x), **TOL["forward.float64"])
            return
        for x, g in zip(xs, got, strict=True):
            errs = [float(np.abs(g - c).max()) for c in _dynamic_candidates(x, lengths)]
            assert min(errs) <= 1e-12, f"length {x.shape[2]}: no consistent frequency state, errors {errs}"
    finally:
        tokenpos.set_kernels(previous)


def test_integer_and_bool_inputs_are_refused() -> None:
    rope = RotaryEmbedding(DH)
    for dtype in (np.int64, np.int32, np.bool_):
        x = np.ones((1, 1, 3, DH), dtype=dtype)
        with pytest.raises(ConfigError, match=f"q must be a floating-point array.*got dtype {np.dtype(dtype)}"):
            rope.apply(x, x)
        with pytest.raises(ConfigError, match="x must be a floating-point array"):
            rope.rotate(x)


def test_pickling_keeps_a_working_lock() -> None:
    import copy

    rope = RotaryEmbedding(DH, scaling=SCALINGS["dynamic"], max_seq_len=MAX)
    twin = copy.deepcopy(rope)
    x = _inputs([5], np.float64)[0]
    np.testing.assert_array_equal(twin.rotate(x), rope.rotate(x))
    assert twin._lock is not rope._lock
