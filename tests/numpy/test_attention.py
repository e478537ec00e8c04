"""tokenpos.numpy scaled_dot_product_attention: every scheme, backward by finite differences, KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.numpy.alibi import ALiBi
from tokenpos.numpy.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from tokenpos.numpy.rotary import RotaryEmbedding
from tokenpos.numpy.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.numpy.t5_bias import T5RelativePositionBias
from tokenpos.tables import ConfigError, PositionError

B, H, DH = 2, 2, 8
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}


def schemes():
    return {
        "none": lambda: None,
        "rope": lambda: RotaryEmbedding(DH, max_seq_len=16, scaling=YARN, rotary_dim=6),
        "alibi": lambda: ALiBi(H, dtype=np.float64),
        "t5": lambda: T5RelativePositionBias(H, num_buckets=8, max_distance=6, dtype=np.float64, seed=3,
                                             bidirectional=False),
    }


def naive(q, k, v, *, bias=None, keep=None, scale=None):
    """Softmax attention written out in float64."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) * scale + (0 if bias is None else bias)
    if keep is not None:
        logits = np.where(keep, logits, -np.inf)
    with np.errstate(invalid="ignore"):                       # a fully masked row gives NaN here
        p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def data(lq: int, lk: int, seed: int = 0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((B, H, lq, DH), (B, H, lk, DH), (B, H, lk, DH)))


@pytest.mark.parametrize("name", ["none", pytest.param("rope", marks=pytest.mark.slow), "alibi", "t5"])
@pytest.mark.parametrize(("lq", "lk", "causal"), [(4, 4, True), (2, 5, True), (3, 3, False)])
def test_backward_matches_finite_differences(name: str, lq: int, lk: int, causal: bool) -> None:
    make = schemes()[name]
    q, k, v = data(lq, lk)
    mask = np.random.default_rng(9).random((1, 1, lq, lk)) * 0.5          # an additive float mask as well
    g = np.random.default_rng(1).standard_normal(q.shape)

    def loss(qq, kk, vv, layer):
        return float(np.sum(scaled_dot_product_attention(qq, kk, vv, positional=layer, causal=causal,
                                                         attn_mask=mask) * g))

    layer = make()
    _, cache = scaled_dot_product_attention_forward(q, k, v, positional=layer, causal=causal, attn_mask=mask)
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    eps = 1e-6
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        numeric = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            plus = loss(q, k, v, make())
            x[i] = old - eps
            minus = loss(q, k, v, make())
            x[i] = old
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, **TOL["fd.nonlinear"])
    for key, w in ([] if layer is None else layer.named_parameters()):   # a scheme's own parameters (T5's weight)
        numeric = np.zeros_like(w.data)
        for i in np.ndindex(w.data.shape):
            fresh_p, fresh_m = make(), make()
            dict(fresh_p.named_parameters())[key].data[i] += eps
            dict(fresh_m.named_parameters())[key].data[i] -= eps
            numeric[i] = (loss(q, k, v, fresh_p) - loss(q, k, v, fresh_m)) / (2 * eps)
        np.testing.assert_allclose(w.grad, numeric, **TOL["fd.nonlinear"], err_msg=key)


@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_forward_matches_naive(name: str) -> None:
    layer = schemes()[name]()
    q, k, v = data(3, 6, seed=2)
    keep = np.arange(6)[None, :] <= (3 + np.arange(3))[:, None]
    bias = None
    kind = getattr(layer, "kind", "none")
    if kind == "rotary":
        q, k, _ = layer.apply_forward(q, k, np.arange(3, 6), key_positions=np.arange(6))
    elif kind == "bias":
        bias = layer.bias(3, 6)[None]
    out = scaled_dot_product_attention(*data(3, 6, seed=2), positional=layer)
    np.testing.assert_allclose(out, naive(q, k, v, bias=bias, keep=keep), **TOL["forward.float64"])


@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_decoding_with_a_cache_equals_full_attention(name: str) -> None:
    layer = schemes()[name]()
    q, k, v = data(7, 7, seed=4)
    full = scaled_dot_product_attention(q, k, v, positional=layer)
    for t in range(1, 7):                    # one new query at a time; the cache holds raw keys 0..t
        step = scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], positional=layer)
        np.testing.assert_allclose(step[:, :, 0], full[:, :, t], **TOL["forward.float64"])
        explicit = scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1],
                                                positional=layer, start_pos=t)
        np.testing.assert_allclose(explicit, step, **TOL["forward.float64"])


def test_rotary_with_pre_rotated_key_cache() -> None:
    rope = RotaryEmbedding(DH)
    q, k, v = data(5, 5, seed=5)
    full = scaled_dot_product_attention(q, k, v, positional=rope)
    k_rot = rope.rotate(k)                                       # a cache that stores rotated keys
    step = scaled_dot_product_attention(q[:, :, 4:], k_rot, v, positional=rope, start_pos=4, rotate_keys=False)
    np.testing.assert_allclose(step[:, :, 0], full[:, :, 4], **TOL["forward.float64"])
    q2, k2, v2 = data(5, 5, seed=6)
    g = np.random.default_rng(0).standard_normal(q2[:, :, 4:].shape)
    _, cache = scaled_dot_product_attention_forward(q2[:, :, 4:], k2, v2, positional=rope, start_pos=4,
                                                    rotate_keys=False)
    dq, dk, _ = scaled_dot_product_attention_backward(g, cache)
    assert dq.shape == (B, H, 1, DH) and dk.shape == k2.shape


def test_additive_schemes_are_ignored_and_masks() -> None:
    q, k, v = data(4, 4, seed=7)
    base = scaled_dot_product_attention(q, k, v)
    sin = SinusoidalPositionalEncoding(16, DH)
    np.testing.assert_array_equal(scaled_dot_product_attention(q, k, v, positional=sin), base)
    keep = np.ones((4, 4), dtype=bool)
    keep[:, 0] = False
    keep[0] = False                                              # row 0 fully masked -> zeros, no NaN
    out, cache = scaled_dot_product_attention_forward(q, k, v, causal=False, attn_mask=keep)
    assert np.all(out[:, :, 0] == 0) and np.isfinite(out).all()
    dq, dk, dv = scaled_dot_product_attention_backward(np.ones_like(out), cache)
    assert np.all(dq[:, :, 0] == 0) and np.isfinite(dk).all() and np.all(dv[:, :, 0] == 0)
    np.testing.assert_allclose(out[:, :, 1:], naive(q, k, v, keep=keep)[:, :, 1:], **TOL["forward.float64"])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_inputs_compute_in_float32(dtype) -> None:
    q, k, v = data(4, 4, seed=8, dtype=dtype)
    out, cache = scaled_dot_product_attention_forward(q, k, v, positional=ALiBi(H))
    assert out.dtype == dtype and cache.probs.dtype == np.float32
    ref = scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), positional=ALiBi(H))
    np.testing.assert_allclose(out, ref, **TOL[f"forward.{np.dtype(dtype).name}"])
    grads = scaled_dot_product_attention_backward(np.ones_like(out), cache)
    assert [gr.dtype for gr in grads] == [dtype] * 3


def test_bad_inputs() -> None:
    q, k, v = data(4, 4)
    with pytest.raises(ConfigError, match="attention expects"):
        scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(ConfigError, match="attention expects"):
        scaled_dot_product_attention(q[0], k[0], v[0])
    rope = RotaryEmbedding(DH)
    with pytest.raises(PositionError, match="start_pos 0 is too small"):
        scaled_dot_product_attention(q[:, :, :1], k, v, positional=rope, start_pos=0)
    with pytest.raises(ConfigError, match="key_positions"):
        scaled_dot_product_attention(q[:, :, :1], k, v, positional=rope, positions=np.array([3]))
    out = scaled_dot_product_attention(q[:, :, :1], k, v, positional=rope, positions=np.array([3]),
                                       key_positions=np.arange(4))
    np.testing.assert_allclose(out, scaled_dot_product_attention(q[:, :, :1], k, v, positional=rope), rtol=1e-12)


@pytest.mark.parametrize("temperature", [None, (2, 0.7)], ids=["plain", "llama4-temperature"])
@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_positions_take_start_pos_none_or_zero_only(name: str, temperature) -> None:
    """Given positions are used as they are: with them start_pos may be None (the default) or 0, also
    with a KV cache (Lq < Lk, key_positions); another start_pos would be ignored, so it is a
    ConfigError whatever the scheme (and for the Llama 4 temperature, which reads the positions)."""
    layer = schemes()[name]()
    q, k, v = data(2, 6, seed=7)
    kw = {"positional": layer, "attn_temperature": temperature}
    default = scaled_dot_product_attention(q, k, v, **kw)                       # queries at 4, 5 of 6 keys
    given = {"positions": np.array([4, 5]), "key_positions": np.arange(6)}
    for start in ({}, {"start_pos": None}, {"start_pos": 0}, {"start_pos": np.int64(0)}):
        np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, **kw, **given, **start), default,
                                   **TOL["forward.float64"])
    for bad in (4, 1, -1):
        with pytest.raises(ConfigError, match=rf"^start_pos={bad} given with positions: positions are used as given, "
                                              r"so start_pos would be ignored; expected start_pos=None or 0"):
            scaled_dot_product_attention_forward(q, k, v, **kw, **given, start_pos=bad)


def test_positions_with_a_pre_rotated_key_cache_take_no_start_pos() -> None:
    """rotate_keys=False rotates q alone at the given positions (the layer gets start 0 from attention)."""
    rope = RotaryEmbedding(DH)
    q, k, v = data(5, 5, seed=5)
    k_rot = rope.rotate(k)
    by_start = scaled_dot_product_attention(q[:, :, 3:], k_rot, v, positional=rope, start_pos=3, rotate_keys=False)
    by_pos = scaled_dot_product_attention(q[:, :, 3:], k_rot, v, positional=rope, positions=np.array([3, 4]),
                                          rotate_keys=False)
    np.testing.assert_allclose(by_pos, by_start, **TOL["forward.float64"])
    with pytest.raises(ConfigError, match="start_pos=3 given with positions"):
        scaled_dot_product_attention(q[:, :, 3:], k_rot, v, positional=rope, positions=np.array([3, 4]), start_pos=3,
                                     rotate_keys=False)


def test_query_temperature_refuses_start_pos_with_positions() -> None:
    from tokenpos.tables.formulas.llama4 import query_temperature

    want = query_temperature((2, 0.7), None, None, 2, 6)                         # queries at 4, 5
    for start in (None, 0):
        np.testing.assert_array_equal(query_temperature((2, 0.7), np.array([4, 5]), start, 2, 6), want)
    with pytest.raises(ConfigError, match="start_pos=4 given with positions"):
        query_temperature((2, 0.7), np.array([4, 5]), 4, 2, 6)


def test_t5_bias_trains_end_to_end() -> None:
    """A few SGD steps through attention move the T5 weights and lower the loss (no hidden state)."""
    t5 = T5RelativePositionBias(H, num_buckets=8, max_distance=6, dtype=np.float64, seed=0)
    q, k, v = data(6, 6, seed=11)
    target = np.random.default_rng(12).standard_normal(q.shape)
    losses = []
    for _ in range(20):
        out, cache = scaled_dot_product_attention_forward(q, k, v, positional=t5)
        losses.append(float(np.mean((out - target) ** 2)))
        t5.zero_grad()
        scaled_dot_product_attention_backward(2 * (out - target) / out.size, cache)
        t5.weight.data -= 5.0 * t5.weight.grad
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128])
def test_integer_bool_or_complex_qkv_are_refused_not_rotated_as_garbage(dtype):
    from tokenpos.tables.errors import DtypeError

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, 4, DH)) for _ in range(3))
    with pytest.raises(DtypeError, match="k must be a floating-point array"):
        scaled_dot_product_attention(q, (k * 3).astype(dtype), v, positional=schemes()["rope"]())


def test_a_scheme_name_string_is_never_treated_as_no_positions():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, 4, DH)) for _ in range(3))
    with pytest.raises(ConfigError, match=r"got the string 'rope'.*emb\.position"):
        scaled_dot_product_attention(q, k, v, positional="rope")


def test_bias_and_mask_shape_mismatches_are_config_errors():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, 4, DH)) for _ in range(3))
    with pytest.raises(ConfigError, match="positional bias has shape"):
        scaled_dot_product_attention(q, k, v, positional=ALiBi(H + 1))
    with pytest.raises(ConfigError, match="attn_mask has shape"):
        scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 4), bool))
