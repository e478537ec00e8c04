"""NumPy scaled_dot_product_attention(..., cu_seqlens=...): block-diagonal attention over packed
documents where every scheme measures positions inside its document. Per token, outputs and
gradients (q, k, v and the bias parameters) equal the same documents padded in (N, H, L, Dh); the
backward matches finite differences."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.tolerances import TOL
from tokenpos.numpy.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from tokenpos.tables import ConfigError

H, DH = 2, 8
LENGTHS = [3, 5, 1, 4]
CU = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
T, L, N = int(CU[-1]), max(LENGTHS), len(LENGTHS)
MASK = np.arange(L)[None, :] < np.array(LENGTHS)[:, None]                     # (N, L) real tokens
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
SCHEMES = {
    "none": lambda: None,
    "nope": lambda: tpn.NoPositionalEncoding(),
    "rope": lambda: tpn.RotaryEmbedding(DH, max_seq_len=16, scaling=YARN, rotary_dim=6),
    "alibi": lambda: tpn.ALiBi(H, dtype=np.float64),
    "t5": lambda: tpn.T5RelativePositionBias(H, num_buckets=8, max_distance=6, dtype=np.float64, seed=3,
                                             bidirectional=False),
    "t5-bidirectional": lambda: tpn.T5RelativePositionBias(H, num_buckets=8, max_distance=6, dtype=np.float64,
                                                           seed=3),
    "fire": lambda: tpn.FIRE(H, width=4, init_L=3.0, dtype=np.float64, seed=3),
    "kerple": lambda: tpn.KERPLE(H, dtype=np.float64, seed=3),
    # xPos packs around each document's centre; M-RoPE rotates at the in-document positions
    "xpos": lambda: tpn.XPosRotaryEmbedding(DH),
    "mrope": lambda: tpn.MRotaryEmbedding(DH, mrope_section=[2, 1, 1]),
}


def data(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((T, H, DH)) for _ in range(3))


def padded(x: np.ndarray) -> np.ndarray:
    """(T, H, Dh) -> (N, H, L, Dh), zeros at the pads."""
    out = np.zeros((N, L, H, DH))
    out[MASK] = x
    return out.transpose(0, 2, 1, 3)


def real(x: np.ndarray) -> np.ndarray:
    """(N, H, L, Dh) -> (T, H, Dh), the real tokens."""
    return x.transpose(0, 2, 1, 3)[MASK]


def grads_of(layer: Any) -> dict[str, np.ndarray]:
    return {} if layer is None else {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_packed_equals_padded_outputs_and_gradients(name: str, causal: bool) -> None:
    q, k, v = data()
    g = data(seed=1)[0]
    packed, pad = SCHEMES[name](), SCHEMES[name]()
    out, cache = scaled_dot_product_attention_forward(q, k, v, positional=packed, causal=causal, cu_seqlens=CU)
    keys = MASK[:, None, None, :]                                              # (N, 1, 1, L): no pad key
    ref, ref_cache = scaled_dot_product_attention_forward(padded(q), padded(k), padded(v), positional=pad,
                                                          causal=causal, attn_mask=keys)
    assert out.shape == (T, H, DH)
    np.testing.assert_allclose(out, real(ref), **TOL["forward.float64"])
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    rq, rk, rv = scaled_dot_product_attention_backward(padded(g), ref_cache)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        np.testing.assert_allclose(got, real(want), **TOL["forward.float64"])
    want_params = grads_of(pad)
    assert grads_of(packed).keys() == want_params.keys()
    for key, grad in grads_of(packed).items():
        np.testing.assert_allclose(grad, want_params[key], **TOL["forward.float64"], err_msg=key)


def test_one_row_of_shape_1_h_t_dh_equals_thd() -> None:
    q, k, v = data()
    want = tpn.scaled_dot_product_attention(q, k, v, positional=tpn.ALiBi(H, dtype=np.float64), cu_seqlens=CU)
    got = tpn.scaled_dot_product_attention(*(x.transpose(1, 0, 2)[None] for x in (q, k, v)),
                                           positional=tpn.ALiBi(H, dtype=np.float64), cu_seqlens=CU)
    np.testing.assert_array_equal(got[0].transpose(1, 0, 2), want)


@pytest.mark.parametrize("name", ["rope", "t5", "fire", "kerple"])
def test_packed_backward_matches_finite_differences(name: str) -> None:
    q, k, v = data()
    g = data(seed=1)[0]
    make = SCHEMES[name]

    def loss(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray, layer: Any) -> float:
        return float(np.sum(tpn.scaled_dot_product_attention(qq, kk, vv, positional=layer, cu_seqlens=CU) * g))

    layer = make()
    _, cache = scaled_dot_product_attention_forward(q, k, v, positional=layer, cu_seqlens=CU)
    grads = scaled_dot_product_attention_backward(g, cache)
    eps = 1e-6
    rng = np.random.default_rng(2)
    for x, grad in zip((q, k, v), grads, strict=True):
        for i in map(tuple, rng.integers(0, x.shape, (25, 3))):
            old = x[i]
            x[i] = old + eps
            plus = loss(q, k, v, make())
            x[i] = old - eps
            minus = loss(q, k, v, make())
            x[i] = old
            np.testing.assert_allclose(grad[i], (plus - minus) / (2 * eps), **TOL["fd.nonlinear"])
    for key, p in ([] if layer is None else layer.named_parameters()):
        for i in np.ndindex(p.data.shape):
            fresh_p, fresh_m = make(), make()
            dict(fresh_p.named_parameters())[key].data[i] += eps
            dict(fresh_m.named_parameters())[key].data[i] -= eps
            numeric = (loss(q, k, v, fresh_p) - loss(q, k, v, fresh_m)) / (2 * eps)
            np.testing.assert_allclose(p.grad[i], numeric, **TOL["fd.nonlinear"], err_msg=key)


@pytest.mark.parametrize("kwargs, text", [
    (dict(positions=np.arange(T)), "positions given together with cu_seqlens"),
    (dict(key_positions=np.arange(T)), "key_positions given together with cu_seqlens"),
    (dict(start_pos=2), "start_pos=2 given together with cu_seqlens"),
])
def test_positions_with_cu_seqlens_are_refused(kwargs: dict[str, Any], text: str) -> None:
    q, k, v = data()
    with pytest.raises(ConfigError, match=text):
        tpn.scaled_dot_product_attention(q, k, v, positional=SCHEMES["rope"](), cu_seqlens=CU, **kwargs)


def test_bad_shapes_and_cu_seqlens_are_refused() -> None:
    q, k, v = data()
    with pytest.raises(ConfigError, match=r"one packed row of the same T tokens.*got q \(2, 2, 13, 8\)"):
        tpn.scaled_dot_product_attention(*(np.zeros((2, H, T, DH)) for _ in range(3)), cu_seqlens=CU)
    with pytest.raises(ConfigError, match=r"got q \(12, 2, 8\) and k \(13, 2, 8\)"):
        tpn.scaled_dot_product_attention(q[1:], k, v, cu_seqlens=CU)
    with pytest.raises(tpn.PositionError, match=f"must end at the number of tokens T = {T}"):
        tpn.scaled_dot_product_attention(q, k, v, cu_seqlens=CU[:-1])


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_no_tokens_give_an_empty_output_and_gradients(name: str) -> None:
    """T = 0 (``cu_seqlens`` [0]) and an unpacked L = 0: empty outputs and gradients, as torch's own
    attention gives (a max over no keys once raised from NumPy)."""
    x = np.zeros((0, H, DH))
    out, cache = scaled_dot_product_attention_forward(x, x, x, positional=SCHEMES[name](), cu_seqlens=np.array([0]))
    assert out.shape == (0, H, DH)
    assert all(g.shape == (0, H, DH) for g in scaled_dot_product_attention_backward(out, cache))
    y = np.zeros((1, H, 0, DH))
    assert tpn.scaled_dot_product_attention(y, y, y, positional=SCHEMES[name]()).shape == (1, H, 0, DH)
