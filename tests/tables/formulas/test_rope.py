"""tables.formulas.rope / formulas.rope_state: cos/sin, the rotation and its transpose, layouts, weight
permutation, HF state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tolerances import TOL
from tokenpos.tables import (
    ConfigError,
    PositionError,
    RopeFrequencies,
    permute_qk_weight,
    rope_cos_sin,
    rope_inv_freq,
    rope_kwargs_from_hf_config,
    rope_rotate,
    rope_rotate_backward,
    rotate_half,
    rotate_pairs,
)
from tokenpos.tables.formulas.rope_state import rope_variant

FAST = settings(max_examples=30, deadline=None)


@st.composite
def rope_inputs(draw):
    half = draw(st.integers(1, 8))
    extra = draw(st.integers(0, 3))
    r, dh = 2 * half, 2 * half + extra
    length = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, length, dh))
    pos = rng.integers(0, 10_000, size=(length,))
    return x, pos, r, draw(st.booleans()), draw(st.sampled_from([1.0, 1.3]))


def tables_for(pos, r, interleaved, factor=1.0):
    inv, _ = rope_inv_freq(r)
    return rope_cos_sin(pos, inv, attention_factor=factor, interleaved=interleaved)


@FAST
@given(rope_inputs())
def test_rotation_preserves_norm_times_factor(data) -> None:
    x, pos, r, interleaved, factor = data
    cos, sin = tables_for(pos, r, interleaved, factor)
    out = rope_rotate(x, cos, sin, interleaved=interleaved)
    np.testing.assert_allclose(np.linalg.norm(out[..., :r], axis=-1), factor * np.linalg.norm(x[..., :r], axis=-1),
                               **TOL["forward.float64"])
    np.testing.assert_array_equal(out[..., r:], x[..., r:])          # partial rotary: the rest passes through


@FAST
@given(rope_inputs())
def test_backward_is_the_transpose(data) -> None:
    x, pos, r, interleaved, factor = data
    cos, sin = tables_for(pos, r, interleaved, factor)
    g = np.random.default_rng(1).standard_normal(x.shape)
    # <R x, g> == <x, R^T g> for a linear map: the adjoint identity, exact up to rounding
    lhs = np.sum(rope_rotate(x, cos, sin, interleaved=interleaved) * g)
    rhs = np.sum(x * rope_rotate_backward(g, cos, sin, interleaved=interleaved))
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
    if factor == 1.0:   # a pure rotation: backward undoes forward
        back = rope_rotate_backward(rope_rotate(x, cos, sin, interleaved=interleaved), cos, sin,
                                    interleaved=interleaved)
        np.testing.assert_allclose(back, x, **TOL["forward.float64"])


def test_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((3, 10)), rng.standard_normal((3, 10))
    cos, sin = tables_for(np.array([0, 7, 123]), 8, True, 1.2)
    analytic = rope_rotate_backward(g, cos, sin, interleaved=True)
    eps, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        numeric[i] = (np.sum(rope_rotate(xp, cos, sin, interleaved=True) * g)
                      - np.sum(rope_rotate(xm, cos, sin, interleaved=True) * g)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, **TOL["fd.linear"])


@FAST
@given(st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 300), st.booleans())
def test_scores_depend_only_on_distance(m: int, n: int, shift: int, interleaved: bool) -> None:
    rng = np.random.default_rng(m * 7919 + n)
    q, k = rng.standard_normal(16), rng.standard_normal(16)
    inv, _ = rope_inv_freq(16)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope_cos_sin(np.array(pq), inv, interleaved=interleaved)
        ck, sk = rope_cos_sin(np.array(pk), inv, interleaved=interleaved)
        return float(rope_rotate(q, cq, sq, interleaved=interleaved) @ rope_rotate(k, ck, sk, interleaved=interleaved))

    assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-9, abs=1e-9)


def test_interleaved_is_complex_multiplication() -> None:
    rng = np.random.default_rng(3)
    x, pos = rng.standard_normal((5, 12)), np.arange(5) * 37
    inv, _ = rope_inv_freq(12)
    cos, sin = rope_cos_sin(pos, inv, interleaved=True)
    out = rope_rotate(x, cos, sin, interleaved=True)
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * pos[:, None] * inv[None, :])
    np.testing.assert_allclose(out[:, 0::2], z.real, **TOL["forward.float64"])
    np.testing.assert_allclose(out[:, 1::2], z.imag, **TOL["forward.float64"])
    # the half layout is the same thing with pair j at (j, j + F)
    ch, sh = rope_cos_sin(pos, inv, interleaved=False)
    half = rope_rotate(np.concatenate([x[:, 0::2], x[:, 1::2]], -1), ch, sh)
    np.testing.assert_allclose(half[:, :6], z.real, **TOL["forward.float64"])


def test_rotate_helpers() -> None:
    x = np.arange(1.0, 7.0)
    np.testing.assert_array_equal(rotate_half(x), [-4, -5, -6, 1, 2, 3])
    np.testing.assert_array_equal(rotate_pairs(x), [-2, 1, -4, 3, -6, 5])


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_weight_permutation_keeps_attention_scores(rotary_dim: int | None) -> None:
    rng = np.random.default_rng(5)
    heads, dh, d, length = 2, 8, 12, 6
    r = rotary_dim or dh
    wq, wk = rng.standard_normal((heads * dh, d)), rng.standard_normal((heads * dh, d))
    x = rng.standard_normal((length, d))
    inv, _ = rope_inv_freq(r)
    pos = np.arange(length)

    def scores(wq_, wk_, interleaved):
        cos, sin = rope_cos_sin(pos, inv, interleaved=interleaved)
        q = rope_rotate((x @ wq_.T).reshape(length, heads, dh).transpose(1, 0, 2), cos, sin, interleaved=interleaved)
        k = rope_rotate((x @ wk_.T).reshape(length, heads, dh).transpose(1, 0, 2), cos, sin, interleaved=interleaved)
        return q @ k.transpose(0, 2, 1)

    meta = scores(wq, wk, True)
    hf = scores(permute_qk_weight(wq, heads, to="half", rotary_dim=rotary_dim),
                permute_qk_weight(wk, heads, to="half", rotary_dim=rotary_dim), False)
    np.testing.assert_allclose(hf, meta, **TOL["forward.float64"])
    back = permute_qk_weight(permute_qk_weight(wq, heads, to="half", rotary_dim=rotary_dim), heads,
                             to="interleaved", rotary_dim=rotary_dim)
    np.testing.assert_array_equal(back, wq)
    bias = rng.standard_normal(heads * dh)
    np.testing.assert_array_equal(permute_qk_weight(bias, heads, to="half", rotary_dim=rotary_dim),
                                  permute_qk_weight(bias[:, None], heads, to="half", rotary_dim=rotary_dim)[:, 0])


def test_weight_permutation_matches_hf_convert_script() -> None:
    rng = np.random.default_rng(0)
    heads, dh, d = 4, 8, 16
    w = rng.standard_normal((heads * dh, d))
    hf = w.reshape(heads, dh // 2, 2, d).transpose(0, 2, 1, 3).reshape(heads * dh, d)   # convert_llama_weights
    np.testing.assert_array_equal(permute_qk_weight(w, heads, to="half"), hf)


def test_cos_sin_layouts_and_validation() -> None:
    inv = np.array([1.0, 0.1])
    cos, sin = rope_cos_sin(np.array([2]), inv, attention_factor=2.0)
    np.testing.assert_allclose(cos[0], 2 * np.cos([2.0, 0.2, 2.0, 0.2]))
    cos_i, _ = rope_cos_sin(np.array([2]), inv, interleaved=True)
    np.testing.assert_allclose(cos_i[0], np.cos([2.0, 2.0, 0.2, 0.2]))
    with pytest.raises(PositionError):
        rope_cos_sin(np.array([-1]), inv)
    with pytest.raises(PositionError):
        rope_cos_sin(np.array([1.5]), inv)
    with pytest.raises(ConfigError, match="to must be one of"):
        permute_qk_weight(np.zeros((8, 2)), 1, to="meta")
    with pytest.raises(ConfigError, match="rotary_dim"):
        permute_qk_weight(np.zeros((8, 2)), 1, rotary_dim=3)


def test_frequency_state_follows_hf_dynamic_update() -> None:
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=32,
                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    hf = LlamaRotaryEmbedding(cfg)
    ours = RopeFrequencies(16, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=32)
    state = ours.initial_state                              # the state is a value: passed in, returned
    x = torch.zeros(1)
    for seq_len in (8, 40, 36, 64, 50, 20, 33, 100, 31):   # grow, keep, grow, keep, reset, grow, ...
        hf(x, torch.arange(seq_len)[None])
        _, which, state = rope_variant(ours, seq_len, state)
        inv = ours.inv_freq_for(which, state)
        assert state.max_seq_len_cached == int(hf.max_seq_len_cached)
        np.testing.assert_allclose(inv, hf.inv_freq.numpy(), **TOL["hf.rope_inv_freq"])


def test_variant_choice_is_pure() -> None:
    """rope_variant changes neither the frozen settings nor the state it is given."""
    import dataclasses

    dyn = RopeFrequencies(8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16)
    start = dyn.initial_state
    key, which, grown = rope_variant(dyn, 40, start)
    assert start is dyn.initial_state and start.max_seq_len_cached == 16
    assert (key, which, grown.max_seq_len_cached) == (("dynamic", 40), "dynamic", 40)
    assert rope_variant(dyn, 40, start)[0] == key                          # same input, same answer
    assert rope_variant(dyn, 8, grown)[2].max_seq_len_cached == 16         # reset
    with pytest.raises(dataclasses.FrozenInstanceError):
        dyn.rope_type = "default"  # type: ignore[misc]
    with pytest.raises(ValueError):
        dyn.original_inv_freq[0] = 0.0
    long = RopeFrequencies(8, scaling={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                                       "original_max_position_embeddings": 12}, max_position_embeddings=16)
    assert rope_variant(long, 12, long.initial_state)[:2] == (("longrope", "short"), "original")
    assert rope_variant(long, 13, long.initial_state)[:2] == (("longrope", "long"), "long")
    assert rope_variant(RopeFrequencies(8), 10**9, start)[:2] == (("static",), "original")


def test_kwargs_from_hf_configs() -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig

    v5 = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                     rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})
    kw = rope_kwargs_from_hf_config(v5)
    assert kw == {"head_dim": 16, "base": 500000.0, "max_seq_len": 128, "rotary_dim": 16, "interleaved": False,
                  "scaling": {"rope_type": "linear", "factor": 2.0}}
    v4 = {"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 64, "rope_theta": 1e6,
          "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16,
          "rope_scaling": {"type": "yarn", "factor": 4.0}}
    kw = rope_kwargs_from_hf_config(v4)
    assert kw["head_dim"] == 32 and kw["rotary_dim"] == 16 and kw["base"] == 1e6
    assert kw["scaling"] == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    with pytest.raises(ConfigError, match="head_dim"):
        rope_kwargs_from_hf_config({"max_position_embeddings": 8})


def test_weight_permutation_works_on_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    w = np.random.default_rng(0).standard_normal((16, 3))
    out = permute_qk_weight(torch.from_numpy(w), 2, to="half", rotary_dim=6)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), permute_qk_weight(w, 2, to="half", rotary_dim=6))
