"""RoPE's serial core: passes over fewer than ``PARALLEL_BYTES`` of q and k (a decode step) run on the
calling thread, where a parallel launch would cost more than the work (measured: benchmarks/HISTORY.md,
2026-11-27).

The suite's conftest sends every other test through the parallel core; here the two are compared
bit for bit over layouts, head counts, per-batch tables and both signs, and the choice is checked at
the threshold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos.kernels.rope as R


def _rope(threshold: int, *args, **kwargs):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "PARALLEL_BYTES", threshold)
        return R.rope_apply(*args, **kwargs)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 4), Hk=st.integers(0, 4), L=st.integers(1, 9),
       F=st.integers(0, 4), tail=st.integers(0, 3), per_batch=st.booleans(), interleaved=st.booleans(),
       f64=st.booleans(), data=st.integers(0, 2**32 - 1))
def test_serial_and_parallel_cores_write_the_same_bits(B, H, Hk, L, F, tail, per_batch, interleaved, f64,
                                                       data) -> None:
    rng = np.random.default_rng(data)
    dt = np.float64 if f64 else np.float32
    Dh = 2 * F + tail
    q = rng.standard_normal((B, H, L, Dh)).astype(dt)
    k = rng.standard_normal((B, Hk, L, Dh)).astype(dt) if Hk else None
    ang = rng.standard_normal((B, L, F) if per_batch else (L, F))
    layout = "interleaved" if interleaved else "half"
    serial = _rope(1 << 62, q, k, np.cos(ang), np.sin(ang), layout=layout)
    parallel = _rope(0, q, k, np.cos(ang), np.sin(ang), layout=layout)
    for s, p in zip(serial, parallel, strict=True):
        assert (s is None) == (p is None)
        if s is not None:
            np.testing.assert_array_equal(s, p)
    back_s = R.rope_apply_backward(q, k, np.cos(ang), np.sin(ang), layout=layout)    # (conftest: parallel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "PARALLEL_BYTES", 1 << 62)
        back_p = R.rope_apply_backward(q, k, np.cos(ang), np.sin(ang), layout=layout)
    for s, p in zip(back_s, back_p, strict=True):
        if s is not None:
            np.testing.assert_array_equal(s, p)


@pytest.mark.parametrize(("nbytes_over", "core"), [(-1, "_rope_core_serial"), (0, "_rope_core")])
def test_the_threshold_picks_the_core(monkeypatch: pytest.MonkeyPatch, nbytes_over: int, core: str) -> None:
    """Under PARALLEL_BYTES of q and k: the serial core; at it and above: the parallel one."""
    q = np.ones((1, 2, 4, 8), np.float32)
    k = np.ones((1, 2, 4, 8), np.float32)
    monkeypatch.setattr(R, "PARALLEL_BYTES", q.nbytes + k.nbytes - nbytes_over)
    ran: list[str] = []
    for name in ("_rope_core", "_rope_core_serial"):
        real = getattr(R, name)
        monkeypatch.setattr(R, name, lambda *a, _n=name, _f=real: (ran.append(_n), _f(*a))[1])
    R.rope_apply(q, k, np.ones((4, 2)), np.zeros((4, 2)))
    assert ran == [core]
