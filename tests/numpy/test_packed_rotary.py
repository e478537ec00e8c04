"""NumPy RotaryEmbedding.apply(q, k, cu_seqlens=...) with qk_layout="thd": HF's rotation at the
position_ids of DataCollatorWithFlattening, the same documents padded (float64: exact), the backward
against finite differences; the layers whose positions are not one index per token refuse cu_seqlens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tests.torch.test_rotary import DH, MAX, SCALINGS, hf_rotary
from tokenpos.tables import ConfigError, PositionError

HQ, HK = 4, 2
LENGTHS = [3, 7, 1, 5]
CU = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
T, L = int(CU[-1]), max(LENGTHS)
MASK = np.arange(L)[None, :] < np.array(LENGTHS)[:, None]                     # (N, L) real tokens


def qk(dtype: type = np.float64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, HQ, DH)).astype(dtype), rng.standard_normal((T, HK, DH)).astype(dtype)


def padded(x: np.ndarray) -> np.ndarray:
    """(T, H, Dh) -> (N, L, H, Dh) padded with zeros (a layer with qk_layout="blhd" reads it)."""
    out = np.zeros((len(LENGTHS), L) + x.shape[1:], x.dtype)
    out[MASK] = x
    return out


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_packed_matches_hf_at_the_flattening_collators_position_ids(name: str) -> None:
    docs = [{"input_ids": list(range(1, n + 1))} for n in LENGTHS]
    pos = DataCollatorWithFlattening(return_position_ids=True)(docs, return_tensors="pt")["position_ids"]
    q, k = qk(np.float32)
    tq, tk = (torch.from_numpy(x).transpose(0, 1)[None] for x in (q, k))      # (1, H, T, Dh), HF's layout
    cos, sin = hf_rotary(SCALINGS[name])(tq, pos)
    ref_q, ref_k = (r[0].transpose(0, 1).numpy() for r in apply_rotary_pos_emb(tq, tk, cos, sin))
    oq, ok = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd").apply(
        q, k, cu_seqlens=CU)
    tol = TOL["hf.rope_rotated"]
    for ours, ref, x in ((oq, ref_q, q), (ok, ref_k, k)):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype
        assert np.abs(ours - ref).max() <= (tol["atol"] + tol["per_position"] * (L - 1)) * np.abs(x).max()


STARTS = {"one int": 6, "per document": np.array([0, 9, 30, 2])}         # flash-attn's seqlen_offsets


@pytest.mark.parametrize("starts", ["none", *sorted(STARTS)])
@pytest.mark.parametrize("name", ["default", "linear", "dynamic", "yarn", "llama3"])
def test_packed_equals_padded_with_equal_gradients(name: str, starts: str, kernel_mode: bool) -> None:
    """Packed equals the padded batch, outputs exact and gradients (float64); with start_pos (where each document
    starts counting) the padded rows sit at start_pos[d] + arange(L), pads at 0 so that dynamic NTK reads the
    same largest position."""
    q, k = qk()
    packed = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")
    pad = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="blhd")
    if starts == "none":
        oq, ok = packed.apply(q, k, cu_seqlens=CU)
        rq, rk = pad.apply(padded(q), padded(k))
    else:
        start = np.broadcast_to(STARTS[starts], len(LENGTHS))
        oq, ok = packed.apply(q, k, cu_seqlens=CU, start_pos=STARTS[starts])
        rq, rk = pad.apply(padded(q), padded(k), np.where(MASK, start[:, None] + np.arange(L), 0))
    np.testing.assert_array_equal(oq, rq[MASK])
    np.testing.assert_array_equal(ok, rk[MASK])
    gq, gk = qk(seed=1)
    dq, dk = packed.backward(gq, gk)
    pq, pk = pad.backward(padded(gq), padded(gk))
    np.testing.assert_allclose(dq, pq[MASK], **TOL["forward.float64"])
    np.testing.assert_allclose(dk, pk[MASK], **TOL["forward.float64"])


@pytest.mark.parametrize("starts", sorted(STARTS))
@pytest.mark.parametrize("name", ["default", "linear", "yarn", "llama3"])
def test_document_starts_are_flash_attn_varlen_seqlen_offsets(name: str, starts: str) -> None:
    """flash-attn's varlen rotary: document d's token i at position seqlen_offsets[d] + i. Reference: HF's own
    rotation of each document alone at those position ids."""
    start = np.broadcast_to(STARTS[starts], len(LENGTHS))
    q, k = qk(np.float32)
    oq, ok = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd").apply(
        q, k, cu_seqlens=CU, start_pos=STARTS[starts])
    hf, tol = hf_rotary(SCALINGS[name]), TOL["hf.rope_rotated"]
    for d, (a, b) in enumerate(zip(CU[:-1], CU[1:], strict=True)):
        tq, tk = (torch.from_numpy(x[a:b]).transpose(0, 1)[None] for x in (q, k))      # (1, H, n, Dh)
        pos = torch.arange(int(start[d]), int(start[d]) + b - a)[None]
        for ours, ref, x in zip((oq[a:b], ok[a:b]), apply_rotary_pos_emb(tq, tk, *hf(tq, pos)), (q, k), strict=True):
            ref = ref[0].transpose(0, 1).numpy()
            assert np.abs(ours - ref).max() <= (tol["atol"] + tol["per_position"] * int(pos.max())) * np.abs(x).max()


def test_bad_document_starts_are_refused_and_keep_nothing() -> None:
    q, k = qk()
    rope = tpn.RotaryEmbedding(DH, qk_layout="thd")
    rope.apply(q, k, cu_seqlens=CU)
    before = rope._last
    for start_pos, error, text in (
            ([1, 2], ConfigError, r"one int per document, shape \(4,\); got shape \(2,\)"),
            ([0, 1, -2, 3], PositionError, r"start_pos -2 at index \(2,\) is negative"),
            (np.array([0.0, 1.0, 2.0, 3.0]), PositionError, "integers"),
            (-1, ConfigError, "start_pos must be >= 0, got -1")):
        with pytest.raises(error, match=text):
            rope.apply(q, k, cu_seqlens=CU, start_pos=start_pos)
    assert rope._last is before
    with pytest.raises(ConfigError, match="xPos packs every document from position 0.*got start_pos=3"):
        tpn.XPosRotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU, start_pos=3)


def test_packed_backward_matches_finite_differences() -> None:
    q, k = qk()
    check_grads(lambda: tpn.RotaryEmbedding(DH, scaling=SCALINGS["yarn"], max_seq_len=MAX, qk_layout="thd"), q,
                run=lambda rope, x: rope.apply(x, k, cu_seqlens=CU)[0],
                backward=lambda rope, g: rope.backward(g, np.zeros_like(k))[0], x_is_float=True, max_elems=60,
                eps=1e-3)                                                       # linear in x: exact differences


def test_refusals() -> None:
    q, k = qk()
    rope = tpn.RotaryEmbedding(DH, qk_layout="thd")
    rope.apply(q, k, cu_seqlens=CU)
    before = rope._last
    with pytest.raises(ConfigError, match="positions given together with cu_seqlens"):
        rope.apply(q, k, np.arange(T), cu_seqlens=CU)
    with pytest.raises(ConfigError, match=r"q must have shape \(T, H, 16\) \(qk_layout='thd'\)"):
        rope.apply(q[None], k[None], cu_seqlens=CU)
    with pytest.raises(ConfigError, match="a packed batch is one row"):
        tpn.RotaryEmbedding(DH).apply(np.zeros((2, HQ, T, DH)), np.zeros((2, HK, T, DH)), cu_seqlens=CU)
    for big in (T + 2, 10**8):                       # a value above T inside: refused before any write past T
        with pytest.raises(PositionError, match=r"cu_seqlens\[2\] ="):
            rope.apply(q, k, cu_seqlens=np.array([0, 1, big, T]))
    assert rope._last is before                                                # a refused call keeps nothing
    x = np.zeros((T, 2, 8))
    for layer in (tpn.MRotaryEmbedding(8, mrope_section=[2, 1, 1], qk_layout="thd"),
                  tpn.RotaryEmbedding2D(8, qk_layout="thd")):
        with pytest.raises(ConfigError, match=f"{type(layer).__name__} does not take cu_seqlens: its positions"):
            layer.apply(x, x, None, cu_seqlens=CU)


@pytest.mark.parametrize("center", [None, 3.0])
def test_packed_xpos_scales_every_document_as_if_run_alone(center: float | None) -> None:
    """xPos packs: each document rotated and scaled around its own centre (``center``, or its length // 2,
    the default of a call of that document alone), forward and backward (float64, bit for bit); an empty
    document too."""
    lengths = [5, 0, 3, 6]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((cu[-1], 4, 8)), rng.standard_normal((cu[-1], 2, 8))
    gq, gk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    layer = tpn.XPosRotaryEmbedding(8, qk_layout="thd", center=center)
    oq, ok = layer.apply(q, k, cu_seqlens=cu)
    dq, dk = layer.backward(gq, gk)
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        rq, rk = layer.apply(q[a:b], k[a:b])
        rdq, rdk = layer.backward(gq[a:b], gk[a:b])
        for got, want in ((oq[a:b], rq), (ok[a:b], rk), (dq[a:b], rdq), (dk[a:b], rdk)):
            np.testing.assert_array_equal(got, want)


def test_packed_call_is_one_pass_over_the_cached_table_and_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed call rotates with the snapshot's (P, F) cos / sin read at the positions (no gathered
    per-call table), q and k handed to the kernel as (T, H, 1, Dh) views of the packed rows (no copy),
    and the backward reads the same table."""
    import tokenpos.numpy.functional.rope as frope

    seen: list[tuple[Any, ...]] = []
    real = frope.rope_apply, frope.rope_apply_backward

    def spy(i: int) -> Any:
        def run(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, **kw: Any) -> Any:
            seen.append((q, k, cos, kw["positions"]))
            return real[i](q, k, cos, sin, **kw)
        return run

    monkeypatch.setattr(frope, "rope_apply", spy(0))
    monkeypatch.setattr(frope, "rope_apply_backward", spy(1))
    q, k = qk()
    rope = tpn.RotaryEmbedding(DH, max_seq_len=MAX, qk_layout="thd")
    oq, ok = rope.apply(q, k, cu_seqlens=CU)
    rope.backward(*qk(seed=1))
    assert len(seen) == 2
    for sq, _, cos, pos in seen:
        assert cos is rope._snap.halves[np.dtype(np.float64)][0] or np.shares_memory(cos, rope._snap.cos)
        assert cos.shape == rope._snap.cos.shape
        assert sq.shape == (T, HQ, 1, DH) and pos.shape == (T, 1)
    assert np.shares_memory(seen[0][0], q) and np.shares_memory(seen[0][1], k)
    assert oq.shape == q.shape and ok.shape == k.shape


def test_packed_float16_and_kernels_off_read_the_same_rows(kernel_mode: bool) -> None:
    """The plain NumPy path (kernels off, float16) reads the table at the positions too: equal to padding."""
    q, k = qk(np.float16)
    oq, ok = tpn.RotaryEmbedding(DH, max_seq_len=MAX, qk_layout="thd").apply(q, k, cu_seqlens=CU)
    rq, rk = tpn.RotaryEmbedding(DH, max_seq_len=MAX, qk_layout="blhd").apply(padded(q), padded(k))
    np.testing.assert_array_equal(oq, rq[MASK])
    np.testing.assert_array_equal(ok, rk[MASK])


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
def test_functional_pair_with_positions_equals_gathered_tables(layout: str, kernel_mode: bool) -> None:
    """``functional.rope_forward`` / ``rope_qk_forward`` and their backwards with a (P, F) table read at
    positions equal the same calls on the gathered (B, L, F) tables, for (B, L, H, Dh) views (rotated in
    their memory order) and contiguous (B, H, L, Dh) inputs."""
    from tokenpos.numpy import functional as F

    rng = np.random.default_rng(3)
    B, H, Lx, P = 2, 3, 5, 9
    q, k = (rng.standard_normal((B, Lx, H, DH) if layout == "blhd" else (B, H, Lx, DH)) for _ in range(2))
    if layout == "blhd":
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    ang = rng.random((P, DH // 2)) * 6
    cos, sin = np.cos(ang), np.sin(ang)
    pos = rng.integers(0, P, (B, Lx))
    x1, c1 = F.rope_forward(q, cos, sin, interleaved=True, positions=pos)
    x2, c2 = F.rope_forward(q, cos[pos], sin[pos], interleaved=True)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(F.rope_backward(k, c1), F.rope_backward(k, c2))
    a, b, c3 = F.rope_qk_forward(q, k, cos, sin, interleaved=False, positions=pos[:1])
    a2, b2, c4 = F.rope_qk_forward(q, k, cos[pos[:1]], sin[pos[:1]], interleaved=False)
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    for g1, g2 in zip(F.rope_qk_backward(k, q, c3), F.rope_qk_backward(k, q, c4), strict=True):
        np.testing.assert_array_equal(g1, g2)
