"""rope_apply / rope_apply_backward against their NumPy twins and the HF formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpos.kernels import rope_apply, rope_apply_backward
from tokenpos.kernels.reference import rope_apply_backward_ref, rope_apply_ref
from tokenpos.tables.errors import ConfigError

SETTINGS = settings(max_examples=30, deadline=None)


def tables(positions: np.ndarray, R: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv = base ** (-np.arange(0, R, 2) / R)                         # (R/2,)
    ang = positions[..., None].astype(np.float64) * inv              # (..., L, R/2)
    return np.cos(ang), np.sin(ang)


@st.composite
def cases(draw):
    B = draw(st.integers(1, 3))
    H = draw(st.integers(1, 4))
    Hk = draw(st.sampled_from([H, 1]))
    L = draw(st.integers(1, 9))
    Dh = 2 * draw(st.integers(1, 12)) + draw(st.sampled_from([0, 0, 1]))
    R = 2 * draw(st.integers(1, Dh // 2))                           # partial rotary when R < Dh
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    tdtype = draw(st.sampled_from([np.float32, np.float64]))
    per_batch = draw(st.booleans())
    layout = draw(st.sampled_from(["half", "interleaved"]))
    with_k = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((B, H, L, Dh)).astype(dtype)
    k = rng.standard_normal((B, Hk, L, Dh)).astype(dtype) if with_k else None
    pos = rng.integers(0, 100, (B, L)) if per_batch else np.arange(L) + 3
    cos, sin = tables(pos, R)
    return q, k, cos.astype(tdtype), sin.astype(tdtype), layout


@SETTINGS
@given(cases())
def test_apply_matches_reference(c) -> None:
    q, k, cos, sin, layout = c
    gq, gk = rope_apply(q, k, cos, sin, layout=layout)
    rq, rk = rope_apply_ref(q, k, cos, sin, layout=layout)
    assert gq.dtype == q.dtype and gq.shape == q.shape
    assert np.array_equal(gq, rq)
    if k is None:
        assert gk is None
    else:
        assert np.array_equal(gk, rk)
    R = 2 * cos.shape[-1]
    assert np.array_equal(gq[..., R:], q[..., R:])                  # pass-through dims


@SETTINGS
@given(cases())
def test_backward_matches_reference_and_inverts(c) -> None:
    q, k, cos, sin, layout = c
    gq, gk = rope_apply_backward(q, k, cos, sin, layout=layout)
    rq, rk = rope_apply_backward_ref(q, k, cos, sin, layout=layout)
    assert np.array_equal(gq, rq)
    if k is not None:
        assert np.array_equal(gk, rk)
    # the backward is the inverse rotation
    if q.dtype == np.float64 and cos.dtype == np.float64:
        back, _ = rope_apply_backward(*rope_apply(q, None, cos, sin, layout=layout)[:1], None, cos, sin,
                                      layout=layout)
        np.testing.assert_allclose(back, q, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_is_adjoint(layout: str, rng) -> None:
    """<R x, g> == <x, R^T g> in float64."""
    x = rng.standard_normal((2, 3, 5, 10))
    g = rng.standard_normal((2, 3, 5, 10))
    cos, sin = tables(np.arange(5), 6)
    y, _ = rope_apply(x, None, cos, sin, layout=layout)
    gx, _ = rope_apply_backward(g, None, cos, sin, layout=layout)
    assert np.isclose(np.sum(y * g), np.sum(x * gx), rtol=1e-12)


def test_half_layout_is_hf_rotate_half(rng) -> None:
    """HF: q*cos + rotate_half(q)*sin with cos = cat(c, c) on the first R dims."""
    B, H, L, Dh, R = 2, 3, 7, 16, 12
    q = rng.standard_normal((B, H, L, Dh))
    cos, sin = tables(np.arange(L), R)
    c = np.concatenate([cos, cos], -1)
    s = np.concatenate([sin, sin], -1)
    x = q[..., :R]
    rot = np.concatenate([-x[..., R // 2:], x[..., : R // 2]], -1)
    want = np.concatenate([x * c + rot * s, q[..., R:]], -1)
    got, _ = rope_apply(q, None, cos, sin, layout="half")
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_interleaved_layout_is_complex_multiply(rng) -> None:
    """Meta: view pairs as complex numbers and multiply by exp(i*theta)."""
    q = rng.standard_normal((1, 2, 4, 8))
    cos, sin = tables(np.arange(4), 8)
    z = q[..., 0::2] + 1j * q[..., 1::2]
    w = z * (cos + 1j * sin)
    want = np.stack([w.real, w.imag], -1).reshape(q.shape)
    got, _ = rope_apply(q, None, cos, sin, layout="interleaved")
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_in_place_and_out(rng) -> None:
    q = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 5, 8)).astype(np.float32)
    cos, sin = tables(np.arange(5), 6)
    want_q, want_k = rope_apply(q, k, cos, sin)
    q2, k2 = q.copy(), k.copy()
    rq, rk = rope_apply(q2, k2, cos, sin, out_q=q2, out_k=k2)
    assert rq is q2 and rk is k2
    assert np.array_equal(q2, want_q) and np.array_equal(k2, want_k)


def test_non_contiguous_input(rng) -> None:
    x = rng.standard_normal((2, 5, 3, 8))                          # (B, L, H, Dh)
    q = x.transpose(0, 2, 1, 3)                                   # (B, H, L, Dh) view
    cos, sin = tables(np.arange(5), 8)
    got, _ = rope_apply(q, None, cos, sin)
    want, _ = rope_apply_ref(np.ascontiguousarray(q), None, cos, sin)
    assert np.array_equal(got, want)


def test_errors(rng) -> None:
    q = np.zeros((1, 1, 4, 8), np.float32)
    cos, sin = tables(np.arange(4), 8)
    with pytest.raises(ConfigError, match="layout"):
        rope_apply(q, None, cos, sin, layout="neox")
    with pytest.raises(ConfigError):
        rope_apply(q, None, *tables(np.arange(3), 8))
    with pytest.raises(ConfigError):
        rope_apply(q, None, *tables(np.arange(4), 10))
    with pytest.raises(ConfigError):
        rope_apply(q, np.zeros((1, 1, 4, 6), np.float32), cos, sin)
    with pytest.raises(ConfigError):
        rope_apply(q[0], None, cos, sin)


@pytest.mark.parametrize("task_rows", [1, 5, 1000])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("Hk", [2, 4])                  # GQA keys: tasks of their own; 4: rotated with q's rows
@pytest.mark.parametrize("per_batch", [True, False])
def test_task_split_does_not_change_results(task_rows: int, layout: str, Hk: int, per_batch: bool, rng,
                                            monkeypatch) -> None:
    """Tasks that straddle heads and batch rows, with shared or per-batch tables, GQA or paired keys."""
    import tokenpos.kernels.rope as Rm

    monkeypatch.setattr(Rm, "ROPE_TASK_BYTES", task_rows * 10 * 4)
    q = rng.standard_normal((3, 4, 7, 10)).astype(np.float32)
    k = rng.standard_normal((3, Hk, 7, 10)).astype(np.float32)
    cos, sin = tables(rng.integers(0, 50, (3, 7) if per_batch else (7,)), 8)
    got = rope_apply(q, k, cos, sin, layout=layout)
    want = rope_apply_ref(q, k, cos, sin, layout=layout)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


# ----------------------------------------------------------------------------------------------
# tables read by position: one (P, R/2) table, row positions[b, l] for token (b, l)
# ----------------------------------------------------------------------------------------------


@st.composite
def indexed_cases(draw):
    """q, k, a (P, R/2) table, positions of every accepted shape ((L,), (1, L), (B, L)), any int dtype."""
    q, k, _, _, layout = draw(cases())
    B, _, L, Dh = q.shape
    R = 2 * draw(st.integers(1, Dh // 2))
    P = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = draw(st.sampled_from([(L,), (1, L), (B, L)]))
    pos = rng.integers(0, P, shape).astype(draw(st.sampled_from([np.int64, np.int32, np.uint8])))
    cos, sin = tables(np.arange(P) * 7 + 1, R)
    tdtype = draw(st.sampled_from([np.float32, np.float64]))
    return q, k, cos.astype(tdtype), sin.astype(tdtype), pos, layout


@SETTINGS
@given(indexed_cases())
def test_positions_read_the_table_rows_bit_for_bit(c) -> None:
    """With positions, the pass equals the same pass on the gathered per-call tables (B, L, R/2) bit for
    bit (and the NumPy twin), forward and backward, q alone and with k (GQA too)."""
    q, k, cos, sin, pos, layout = c
    B, _, L, _ = q.shape
    idx = np.broadcast_to(pos.reshape(-1, L), (B, L))
    for run, ref in ((rope_apply, rope_apply_ref), (rope_apply_backward, rope_apply_backward_ref)):
        got = run(q, k, cos, sin, layout=layout, positions=pos)
        gathered = run(q, k, cos[idx], sin[idx], layout=layout)
        twin = ref(q, k, cos, sin, layout=layout, positions=pos)
        for a, b, t in zip(got, gathered, twin, strict=True):
            if a is None:
                assert b is None and t is None
                continue
            assert np.array_equal(a, b) and np.array_equal(a, t)


@pytest.mark.parametrize("task_rows", [1, 5, 1000])
@pytest.mark.parametrize("Hk", [2, 4])
@pytest.mark.parametrize("shape", [(7,), (3, 7), (21, 1)])
def test_positions_task_split_does_not_change_results(task_rows: int, Hk: int, shape: tuple[int, ...], rng,
                                                      monkeypatch) -> None:
    """Tasks straddling heads and batch rows read the right position; (21, 1): one token per batch row
    (the (T, H, 1, Dh) view of a packed row)."""
    import tokenpos.kernels.rope as Rm

    monkeypatch.setattr(Rm, "ROPE_TASK_BYTES", task_rows * 10 * 4)
    B, L = (3, 7) if shape[-1] == 7 else shape
    q = rng.standard_normal((B, 4, L, 10)).astype(np.float32)
    k = rng.standard_normal((B, Hk, L, 10)).astype(np.float32)
    pos = rng.integers(0, 30, shape)
    cos, sin = tables(np.arange(30), 8)
    got = rope_apply(q, k, cos, sin, positions=pos)
    want = rope_apply_ref(q, k, cos, sin, positions=pos)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_positions_errors(rng) -> None:
    from tokenpos.tables.errors import DtypeError, PositionError

    q = rng.standard_normal((2, 1, 4, 6)).astype(np.float32)
    cos, sin = tables(np.arange(5), 6)
    with pytest.raises(PositionError, match="position 5 at index"):
        rope_apply(q, None, cos, sin, positions=np.array([0, 1, 5, 2]))
    with pytest.raises(PositionError, match="negative"):
        rope_apply(q, None, cos, sin, positions=np.array([[0, 1, -1, 2]]))
    with pytest.raises(DtypeError, match="position"):
        rope_apply(q, None, cos, sin, positions=np.zeros(4))
    with pytest.raises(ConfigError, match=r"positions must have shape \(4,\), \(1, 4\) or \(2, 4\)"):
        rope_apply(q, None, cos, sin, positions=np.zeros((3, 4), np.int64))
    with pytest.raises(ConfigError, match=r"read by positions must have shape \(P, R/2\)"):
        rope_apply(q, None, cos[None], sin[None], positions=np.zeros(4, np.int64))
    with pytest.raises(ConfigError, match=r"read by positions must have shape \(P, R/2\) with R <= head_dim=6"):
        rope_apply(q, None, *tables(np.arange(5), 8), positions=np.zeros(4, np.int64))
