"""tokenpos.numpy.RotaryEmbedding: forward against tables, backward against finite differences, cache, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.numpy.helpers import FAST
from tests.tolerances import TOL
from tokenpos.numpy.rotary import CACHE_GROWTH_LIMIT, RotaryEmbedding
from tokenpos.tables import ConfigError, PositionError, rope_cos_sin, rope_inv_freq, rope_rotate

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 5.0, 6.0],
            "original_max_position_embeddings": 8}


def reference(x: np.ndarray, pos: np.ndarray, r: int, *, interleaved: bool = False, scaling=None,
              max_pos: int = 16, seq_len: int | None = None) -> np.ndarray:
    inv, factor = rope_inv_freq(r, scaling=scaling, max_position_embeddings=max_pos, seq_len=seq_len)
    cos, sin = rope_cos_sin(pos, inv, attention_factor=factor, interleaved=interleaved)
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    return rope_rotate(x.astype(np.float64), cos, sin, interleaved=interleaved)


@FAST
@given(st.sampled_from([np.float16, np.float32, np.float64]), st.booleans(), st.sampled_from([None, 4]),
       st.sampled_from(["none", "start", "1d", "2d"]), st.integers(0, 2**16))
def test_apply_matches_tables(dtype, interleaved, rotary_dim, pos_kind, seed) -> None:
    rng = np.random.default_rng(seed)
    b, length, dh = 2, 5, 8
    q = rng.standard_normal((b, 3, length, dh)).astype(dtype)
    k = rng.standard_normal((b, 1, length, dh)).astype(dtype)       # fewer kv heads (GQA) is fine
    rope = RotaryEmbedding(dh, max_seq_len=16, interleaved=interleaved, rotary_dim=rotary_dim)
    kwargs, pos = {}, np.arange(length)
    if pos_kind == "start":
        kwargs, pos = {"start_pos": 11}, np.arange(11, 11 + length)
    elif pos_kind == "1d":
        pos = rng.integers(0, 40, size=length)
        kwargs = {"positions": pos}
    elif pos_kind == "2d":
        pos = rng.integers(0, 40, size=(b, length))
        kwargs = {"positions": pos}
    q2, k2 = rope.apply(q, k, **kwargs)
    assert q2.dtype == dtype and k2.dtype == dtype and q2.shape == q.shape and k2.shape == k.shape
    tol = TOL[f"forward.{np.dtype(dtype).name}"]
    r = rotary_dim or dh
    np.testing.assert_allclose(q2, reference(q, pos, r, interleaved=interleaved), **tol)
    np.testing.assert_allclose(k2, reference(k, pos, r, interleaved=interleaved), **tol)


@pytest.mark.slow  # finite differences (test_functional.py keeps a fast RoPE one)
@pytest.mark.parametrize("scaling", [None, YARN, LONGROPE, {"rope_type": "dynamic", "factor": 2.0}])
@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_matches_finite_differences(scaling, interleaved: bool) -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 2, 3, 8)), rng.standard_normal((2, 2, 3, 8))
    pos = np.array([[0, 5, 20], [3, 4, 9]])                         # crosses the original max of 8
    gq, gk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    rotary_dim = None if scaling is LONGROPE else 6                 # partial rotary where the factors allow

    def loss(qq, kk):
        rope = RotaryEmbedding(8, max_seq_len=8, scaling=scaling, interleaved=interleaved, rotary_dim=rotary_dim)
        a, b = rope.apply(qq, kk, pos)
        return float(np.sum(a * gq) + np.sum(b * gk))

    rope = RotaryEmbedding(8, max_seq_len=8, scaling=scaling, interleaved=interleaved, rotary_dim=rotary_dim)
    rope.apply(q, k, pos)
    dq, dk = rope.backward(gq, gk)
    eps = 1e-6
    for x, grad in ((q, dq), (k, dk)):
        numeric = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            plus = loss(q, k)
            x[i] = old - eps
            minus = loss(q, k)
            x[i] = old
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, **TOL["fd.linear"])


def test_functional_pair_keeps_no_state() -> None:
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((1, 2, 4, 8)), rng.standard_normal((1, 2, 6, 8))
    rope = RotaryEmbedding(8)
    q2, k2, cache = rope.apply_forward(q, k, np.arange(2, 6), key_positions=np.arange(6))
    np.testing.assert_allclose(k2, reference(k, np.arange(6), 8), **TOL["forward.float64"])
    np.testing.assert_allclose(q2, reference(q, np.arange(2, 6), 8), **TOL["forward.float64"])
    g = rng.standard_normal(q.shape)
    dq, _ = rope.apply_backward(g, np.zeros_like(k), cache)
    np.testing.assert_allclose(np.sum(q2 * g), np.sum(q * dq), rtol=1e-12)
    with pytest.raises(RuntimeError, match="before forward"):
        rope.backward(g, g)


def test_kv_cache_and_packed_sequences() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 10, 8))
    rope = RotaryEmbedding(8, max_seq_len=4)                        # the cache has to grow
    whole = rope.rotate(x)
    pieces = [rope.rotate(x[:, :, :6]), rope.rotate(x[:, :, 6:9], start_pos=6), rope.rotate(x[:, :, 9:], start_pos=9)]
    np.testing.assert_array_equal(np.concatenate(pieces, axis=2), whole)
    packed = np.array([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])             # three documents in one row
    out = rope.rotate(x, packed)
    np.testing.assert_array_equal(out[:, :, 4:7], rope.rotate(x[:, :, 4:7]))


def test_cache_grows_and_key_tracks_the_variant() -> None:
    rope = RotaryEmbedding(8, max_seq_len=8, scaling=LONGROPE)
    x = np.random.default_rng(3).standard_normal((1, 1, 4, 8))
    short = rope.rotate(x)                                          # needs 4 <= 8: short factors
    np.testing.assert_allclose(short, reference(x, np.arange(4), 8, scaling=LONGROPE, max_pos=8), rtol=1e-13)
    long = rope.rotate(x, np.array([0, 1, 2, 30]))                  # needs 31 > 8: long factors for all
    ref = reference(x, np.array([0, 1, 2, 30]), 8, scaling=LONGROPE, max_pos=8, seq_len=31)
    np.testing.assert_allclose(long, ref, rtol=1e-13)
    assert rope._cache_key[-1] == ("longrope", "long") and rope._cos.shape[0] >= 31
    np.testing.assert_array_equal(rope.rotate(x), short)            # back to short: the key changed again
    far = np.array([0, 1, 2, CACHE_GROWTH_LIMIT * 8 + 5])
    before = rope._cos.shape[0]
    np.testing.assert_allclose(rope.rotate(x, far), reference(x, far, 8, scaling=LONGROPE, max_pos=8, seq_len=10**6),
                               rtol=1e-12, atol=1e-12)
    assert rope._cos.shape[0] == before                             # far positions are computed, not cached


def test_state_dict_and_repr() -> None:
    rope = RotaryEmbedding(8, scaling=YARN, max_seq_len=32)
    assert rope.state_dict() == {} and rope.parameters() == []
    assert rope.kind == "rotary" and "yarn" in repr(rope)
    assert rope.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)


def test_bad_inputs() -> None:
    rope = RotaryEmbedding(8)
    q = np.zeros((1, 2, 3, 8))
    with pytest.raises(ConfigError, match=r"q must have shape \(B, H, L, 8\), got \(1, 2, 3, 6\)"):
        rope.apply(np.zeros((1, 2, 3, 6)), q)
    with pytest.raises(ConfigError, match="same batch and length"):
        rope.apply(q, np.zeros((1, 2, 4, 8)))
    with pytest.raises(ConfigError, match=r"positions must have shape \(3,\) or \(1, 3\)"):
        rope.apply(q, q, np.arange(4))
    with pytest.raises(PositionError, match="negative"):
        rope.apply(q, q, np.array([0, -1, 2]))
    with pytest.raises(PositionError, match="integers"):
        rope.apply(q, q, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ConfigError, match="start_pos"):
        rope.apply(q, q, start_pos=-1)
    with pytest.raises(ConfigError, match="rotary_dim"):
        RotaryEmbedding(8, rotary_dim=5)
    with pytest.raises(ConfigError, match="conflicts"):
        RotaryEmbedding(8, rotary_dim=4, scaling={"rope_type": "default", "partial_rotary_factor": 0.25})
    with pytest.raises(ConfigError, match="'factor'"):
        RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ConfigError, match="interleaved"):
        RotaryEmbedding(8, interleaved="yes")


def test_from_hf_config_matches_llama_rotary() -> None:
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64,
                      rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                       "rope_theta": 500000.0})
    rope = RotaryEmbedding.from_hf_config(cfg)
    assert (rope.head_dim, rope.base, rope.max_seq_len) == (16, 500000.0, 64)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, 12, 16)).astype(np.float32)
    k = rng.standard_normal((2, 4, 12, 16)).astype(np.float32)
    pos = np.stack([np.arange(12), np.arange(12) + 40])
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.from_numpy(q), torch.from_numpy(pos))
    hq, hk = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    q2, k2 = rope.apply(q, k, pos)
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * pos.max()) * np.abs(q).max()
    assert np.abs(q2 - hq.numpy()).max() <= bound and np.abs(k2 - hk.numpy()).max() <= bound
