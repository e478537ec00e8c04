"""The embedding forward's serial core: outputs under ``PARALLEL_BYTES`` run on the calling thread.

The suite's conftest sends every other test through the parallel core; here the two are compared
bit for bit, and the choice between them is checked at the threshold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos.kernels.embedding as E
from tokenpos.tables.errors import PositionError, TokenIdError


def _forward(threshold: int, *args, **kwargs) -> np.ndarray:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(E, "PARALLEL_BYTES", threshold)
        return E.embedding_forward(*args, **kwargs)


@settings(max_examples=40, deadline=None)
@given(V=st.integers(1, 30), D=st.integers(1, 40), B=st.integers(1, 3), L=st.integers(1, 8),
       p=st.sampled_from([0.0, 0.1, 0.5]), pos=st.booleans(), bf16=st.booleans(),
       data=st.integers(0, 2**32 - 1))
def test_serial_and_parallel_cores_write_the_same_bits(V, D, B, L, p, pos, bf16, data) -> None:
    rng = np.random.default_rng(data)
    if bf16:
        w = rng.integers(0, 1 << 16, (V, D)).astype(np.uint16)
        pt = rng.integers(0, 1 << 16, (L, D)).astype(np.uint16) if pos else None
    else:
        w = rng.standard_normal((V, D)).astype(np.float32)
        pt = rng.standard_normal((L, D)).astype(np.float32) if pos else None
    ids = rng.integers(0, V, (B, L))
    kw = dict(scale=1.5, pos_table=pt, pos_ids=np.arange(L) if pos else None, dropout_p=p, seed=7, bf16=bf16)
    serial = _forward(1 << 62, w, ids, **kw)
    parallel = _forward(0, w, ids, **kw)
    assert serial.dtype == parallel.dtype and np.array_equal(serial.view(np.uint8), parallel.view(np.uint8))


@pytest.mark.parametrize("threshold", [0, 1 << 62])
def test_both_cores_refuse_bad_ids_and_positions(threshold: int, rng) -> None:
    w = rng.standard_normal((5, 4)).astype(np.float32)
    pt = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(TokenIdError, match="token id 5 at index"):
        _forward(threshold, w, np.array([[0, 5]]))
    with pytest.raises(PositionError):
        _forward(threshold, w, np.array([[0, 1]]), pos_table=pt, pos_ids=np.array([0, 3]))


def test_the_output_size_chooses_the_core(rng, monkeypatch) -> None:
    """Under ``PARALLEL_BYTES`` of output (half that with dropout) the serial core runs; at or above
    it, the parallel one."""
    monkeypatch.setattr(E, "PARALLEL_BYTES", 4096)
    calls: list[str] = []
    for name in ("forward_core", "forward_core_serial"):
        core = getattr(E, name)
        monkeypatch.setattr(E, name, lambda *a, core=core, name=name: calls.append(name) or core(*a))
    w = rng.standard_normal((10, 16)).astype(np.float32)            # rows of 64 bytes
    E.embedding_forward(w, np.zeros(63, np.int64))                  # 4032 bytes
    E.embedding_forward(w, np.zeros(64, np.int64))                  # 4096 bytes
    E.embedding_forward(w, np.zeros(31, np.int64), dropout_p=0.1)   # 1984 bytes, dropout: counted twice
    E.embedding_forward(w, np.zeros(32, np.int64), dropout_p=0.1)   # 2048 bytes
    assert calls == ["forward_core_serial", "forward_core", "forward_core_serial", "forward_core"]
