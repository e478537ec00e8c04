"""NumPy RotaryEmbedding.apply(q, k, cu_seqlens=...) with qk_layout="thd": HF's rotation at the
position_ids of DataCollatorWithFlattening, the same documents padded (float64: exact), the backward
against finite differences; the layers whose positions are not one index per token refuse cu_seqlens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tests.torch.test_rotary import DH, MAX, SCALINGS, hf_rotary
from tokenpos.tables import ConfigError

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


@pytest.mark.parametrize("name", ["default", "linear", "dynamic", "yarn", "llama3"])
def test_packed_equals_padded_with_equal_gradients(name: str, kernel_mode: bool) -> None:
    q, k = qk()
    packed = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")
    pad = tpn.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="blhd")
    oq, ok = packed.apply(q, k, cu_seqlens=CU)
    rq, rk = pad.apply(padded(q), padded(k))
    np.testing.assert_array_equal(oq, rq[MASK])
    np.testing.assert_array_equal(ok, rk[MASK])
    gq, gk = qk(seed=1)
    dq, dk = packed.backward(gq, gk)
    pq, pk = pad.backward(padded(gq), padded(gk))
    np.testing.assert_allclose(dq, pq[MASK], **TOL["forward.float64"])
    np.testing.assert_allclose(dk, pk[MASK], **TOL["forward.float64"])


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
    assert rope._last is before                                                # a refused call keeps nothing
    x = np.zeros((T, 2, 8))
    for layer in (tpn.XPosRotaryEmbedding(8, qk_layout="thd"),
                  tpn.MRotaryEmbedding(8, mrope_section=[2, 1, 1], qk_layout="thd"),
                  tpn.RotaryEmbedding2D(8, qk_layout="thd")):
        with pytest.raises(ConfigError, match=f"{type(layer).__name__} does not take cu_seqlens"):
            layer.apply(x, x, None, cu_seqlens=CU)
