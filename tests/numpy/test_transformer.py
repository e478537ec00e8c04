"""numpy.transformer: TransformerEmbedding (alias EmbeddingLayer), every option, forward and backward."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import SLOW, dense_lookup_grad, dtypes, id_arrays
from tests.tolerances import TOL
from tokenpos.tables import sinusoidal_encoding
from tokenpos.tables.formulas.dropout import dropout_keep_mask
from tokenpos.tables.formulas.positions import positions_from_padding

V, D, P = 7, 4, 6


def layernorm_ref(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def rmsnorm_ref(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def reference(layer, ids, positions=None, start_pos=0, token_type_ids=None):
    """The documented forward without dropout, in float64, from the layer's public parts."""
    ids = np.asarray(ids)
    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    x = f64(layer.token.weight.data)[ids] * (math.sqrt(layer.d_model) if layer.token.scale else 1.0)
    if positions is None:
        if layer.position_ids == "padding":
            positions = positions_from_padding(ids, layer.padding_idx, start_pos)
        else:
            positions = start_pos + np.arange(ids.shape[-1])
    positions = np.broadcast_to(positions, ids.shape)
    if layer.positional == "learned":
        x = x + f64(layer.position.weight.data)[positions]
    elif layer.positional == "sinusoidal":
        x = x + sinusoidal_encoding(positions, layer.d_model)
    if layer.token_type is not None:
        tt = np.zeros_like(ids) if token_type_ids is None else token_type_ids
        x = x + f64(layer.token_type.weight.data)[tt]
    if isinstance(layer.norm, tpn.LayerNorm):
        x = layernorm_ref(x, f64(layer.norm.weight.data), f64(layer.norm.bias.data), layer.norm.eps)
    elif isinstance(layer.norm, tpn.RMSNorm):
        x = rmsnorm_ref(x, f64(layer.norm.weight.data), layer.norm.eps)
    return x


def make(positional="learned", *, scale=False, dropout=0.0, norm=None, num_token_types=0, padding_idx=None,
         dtype=np.float64, seed=0, **kw):
    layer = tpn.TransformerEmbedding(V, D, P, positional=positional, scale=scale, dropout=dropout, norm=norm,
                                     num_token_types=num_token_types, padding_idx=padding_idx, dtype=dtype,
                                     seed=seed, init="standard_normal", **kw)
    if layer.norm is not None:   # non-trivial affine parameters, so the norm's backward is fully exercised
        rng = np.random.default_rng(100)
        for p in layer.norm.parameters():
            p.data[...] = rng.standard_normal(p.shape)
    return layer


IDS = np.array([[3, 1, 3, 6], [1, 0, 5, 3]])          # duplicates; id 1 is the padding id when used
TT = np.array([[0, 2, 2, 1], [1, 1, 0, 2]])

COMBOS = list(itertools.product(["learned", "sinusoidal", "none"], [False, True], [0.0, 0.3],
                                [None, "layernorm", "rmsnorm"], [0, 3], [None, 1]))


FAST_COMBOS = [("learned", True, 0.3, "layernorm", 3, 1), ("sinusoidal", False, 0.0, "rmsnorm", 0, None),
               ("none", True, 0.0, None, 3, None)]    # every value of every option once; the rest is slow


@pytest.mark.parametrize("positional, scale, dropout, norm, types, padding_idx",
                         [c if c in FAST_COMBOS else pytest.param(*c, marks=pytest.mark.slow) for c in COMBOS])
def test_finite_differences_every_option(positional, scale, dropout, norm, types, padding_idx):
    def fresh():
        return make(positional, scale=scale, dropout=dropout, norm=norm, num_token_types=types,
                    padding_idx=padding_idx, seed=7)

    tt = TT if types else None
    grads = check_grads(fresh, IDS, run=lambda layer, ids: layer(ids, token_type_ids=tt),
                        tol="fd.nonlinear" if norm else "fd.linear",
                        no_grad_rows={"token.weight": padding_idx} if padding_idx is not None else None)
    assert not grads["token.weight"][[2, 4]].any(), "rows never looked up get no gradient"
    if positional == "learned":
        assert not grads["position.weight"][[4, 5]].any()
    expected = {"token.weight"} | ({"position.weight"} if positional == "learned" else set())
    expected |= {"token_type.weight"} if types else set()
    expected |= {"layernorm": {"norm.weight", "norm.bias"}, "rmsnorm": {"norm.weight"}, None: set()}[norm]
    assert set(grads) == expected


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("norm", [None, "layernorm", "rmsnorm"])
def test_forward_matches_reference(positional, norm):
    layer = make(positional, scale=True, norm=norm, num_token_types=3, padding_idx=1, dropout=0.5).eval()
    np.testing.assert_allclose(layer(IDS, token_type_ids=TT), reference(layer, IDS, token_type_ids=TT),
                               **TOL["forward.float64"])
    np.testing.assert_allclose(layer(IDS), reference(layer, IDS), **TOL["forward.float64"])


@SLOW
@given(data=st.data(), dtype=dtypes, positional=st.sampled_from(["learned", "sinusoidal", "none"]),
       scale=st.booleans(), padding_idx=st.sampled_from([None, 0]))
def test_shapes_dtypes_and_id_patterns(data, dtype, positional, scale, padding_idx):
    layer = make(positional, scale=scale, padding_idx=padding_idx, dtype=dtype)
    ids = data.draw(id_arrays(V, padding_idx=padding_idx, max_len=P))
    out = layer(ids)
    assert out.shape == ids.shape + (D,) and out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, reference(layer, ids), **TOL[f"forward.{np.dtype(dtype).name}"])
    g = np.random.default_rng(0).standard_normal(out.shape).astype(dtype)
    assert layer.backward(g) is None
    ref = dense_lookup_grad(ids, g, V, multiplier=layer.token.multiplier, padding_idx=padding_idx)
    got = layer.token.weight.grad
    np.testing.assert_allclose(np.zeros((V, D)) if got is None else got, ref, **TOL[f"grad.{np.dtype(dtype).name}"])


def test_seed_example_shape():
    emb = tpn.TransformerEmbedding(50, 8, 16, seed=0)
    assert emb(np.array([[1, 2, 3, 4], [5, 6, 7, 8]])).shape == (2, 4, 8)
    assert emb(np.array([1, 2, 3])).shape == (3, 8)
    assert emb(np.array([1, 2, 3])).dtype == np.float32
    assert tpn.EmbeddingLayer is tpn.TransformerEmbedding


def test_one_dimensional_ids_equal_a_batch_of_one():
    layer = make("learned", norm="layernorm")
    np.testing.assert_array_equal(layer(IDS[0]), layer(IDS[:1])[0])


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_start_pos_continues_the_sequence(positional):
    layer = make(positional)
    full = layer(IDS)
    np.testing.assert_allclose(layer(IDS[:, 2:], start_pos=2), full[:, 2:], rtol=1e-15)
    np.testing.assert_allclose(layer(IDS[:, -1:], start_pos=3), full[:, -1:], rtol=1e-15)


def test_start_pos_beyond_max_seq_len():
    sin = make("sinusoidal")
    out = sin(IDS, start_pos=100)
    np.testing.assert_allclose(out, reference(sin, IDS, start_pos=100), **TOL["forward.float64"])
    with pytest.raises(tpn.PositionError, match=rf"position 6 at index \(0, 3\) is out of range \[0, {P}\)"):
        make("learned")(IDS, start_pos=3)
    make("learned")(IDS, start_pos=2)     # positions 2..5: the last row of the table is usable


def test_explicit_positions():
    layer = make("learned")
    pos_l = np.array([5, 0, 0, 2])
    pos_bl = np.array([[5, 0, 0, 2], [1, 1, 4, 3]])
    np.testing.assert_allclose(layer(IDS, pos_l), reference(layer, IDS, positions=pos_l), **TOL["forward.float64"])
    np.testing.assert_allclose(layer(IDS, pos_bl), reference(layer, IDS, positions=pos_bl), **TOL["forward.float64"])
    check_grads(lambda: make("learned"), IDS, run=lambda layer, ids: layer(ids, pos_bl))
    with pytest.raises(ValueError, match=r"positions must have shape \(4,\) or \(2, 4\), got \(3,\)"):
        layer(IDS, np.array([0, 1, 2]))


@pytest.mark.parametrize("positional, kw", [("learned", {}), ("sinusoidal", {}), ("rope", {"num_heads": 2}),
                                           ("learned", {"position_ids": "padding", "padding_idx": 1})],
                         ids=["learned", "sinusoidal", "rope", "roberta"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("pos", [np.array([5, 0, 0, 2]), np.array([[5, 0, 0, 2], [1, 1, 4, 3]])], ids=["L", "BL"])
def test_start_pos_with_positions_is_refused_and_changes_nothing(kernel_mode, positional, kw, dropout, pos):
    """Given positions are used as they are: a nonzero start_pos would be ignored, so it is a
    ConfigError, raised before the dropout seed is drawn or a backward cache is kept; start_pos=0
    (any integer type) is the call without it."""
    layer = make(positional, dropout=dropout, **kw)                          # training mode: dropout active
    with pytest.raises(tpn.ConfigError) as err:
        layer(IDS, pos, start_pos=3)
    assert "start_pos=3 given with positions" in str(err.value)
    assert layer._cache is None                                              # nothing kept for backward
    first = make(positional, dropout=dropout, **kw)(IDS, pos)
    np.testing.assert_array_equal(layer(IDS, pos), first)                   # the generator did not move
    for zero in (0, np.int64(0)):
        np.testing.assert_array_equal(make(positional, dropout=dropout, **kw)(IDS, pos, start_pos=zero), first)


def test_roberta_padding_positions():
    layer = make("learned", padding_idx=1, position_ids="padding")
    ids = np.array([[0, 4, 5, 1, 1], [0, 6, 1, 1, 1]])   # real tokens start at padding_idx + 1
    out = layer(ids)
    expected_pos = np.array([[2, 3, 4, 1, 1], [2, 3, 1, 1, 1]])
    np.testing.assert_allclose(out, reference(layer, ids, positions=expected_pos), **TOL["forward.float64"])
    layer(ids[:, :2], start_pos=1)                      # decoding: positions shift by start_pos
    with pytest.raises(tpn.PositionError, match="position 6"):
        layer(np.array([[0, 2, 3, 4, 5]]))                   # 1 + 5 = 6 >= max_seq_len
    with pytest.raises(ValueError, match="position_ids='padding'.*needs padding_idx"):
        make("learned", position_ids="padding")
    with pytest.raises(ValueError, match="position_ids must be one of"):
        make("learned", position_ids="roberta")


def test_token_types():
    layer = make("none", num_token_types=2)
    assert layer.token_type.weight.shape == (2, D)
    np.testing.assert_array_equal(layer(IDS), layer(IDS, token_type_ids=np.zeros_like(IDS)))
    assert not np.array_equal(layer(IDS), layer(IDS, token_type_ids=np.ones_like(IDS)))
    with pytest.raises(tpn.TokenIdError, match=r"token id 2 at index \(0, 0\) is out of range \[0, 2\)"):
        layer(IDS, token_type_ids=np.full(IDS.shape, 2))
    with pytest.raises(ValueError, match=r"token_type_ids must have shape \(2, 4\), got \(4,\)"):
        layer(IDS, token_type_ids=np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="num_token_types=0"):
        make("none")(IDS, token_type_ids=np.zeros_like(IDS))


def test_scale_multiplies_only_the_token_part():
    a, b = make("learned", scale=False), make("learned", scale=True)
    tok = a.token(IDS)
    np.testing.assert_allclose(b(IDS) - a(IDS), tok * (math.sqrt(D) - 1.0), rtol=1e-12, atol=1e-12)


# -- dropout, train / eval, seeds ------------------------------------------------------------------

def big(seed=0, dropout=0.25, **kw):
    return tpn.TransformerEmbedding(100, 32, 64, dropout=dropout, seed=seed, dtype=np.float64, **kw)


BIG_IDS = np.random.default_rng(0).integers(1, 100, size=(8, 64))


def test_dropout_only_in_training_mode():
    layer = big()
    assert layer.training, "NumPy layers default to training mode, as torch modules do"
    clean = layer.eval()(BIG_IDS)
    np.testing.assert_array_equal(clean, layer(BIG_IDS)), "eval: deterministic, no dropout"
    np.testing.assert_allclose(clean, reference(layer, BIG_IDS), **TOL["forward.float64"])
    noisy = layer.train()(BIG_IDS)
    kept = noisy != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(noisy[kept], clean[kept] / 0.75, rtol=1e-12)
    assert not np.array_equal(noisy, layer(BIG_IDS)), "each training forward draws a fresh mask"
    no_drop = big(dropout=0.0)
    np.testing.assert_array_equal(no_drop(BIG_IDS), no_drop.eval()(BIG_IDS))


def test_backward_uses_the_forward_mask():
    layer = big()
    out = layer(BIG_IDS[:2, :5])
    layer.backward(np.ones_like(out))
    ref = dense_lookup_grad(BIG_IDS[:2, :5], (out != 0) / 0.75, 100)
    np.testing.assert_allclose(layer.token.weight.grad, ref, rtol=1e-12)
    layer.zero_grad()
    out = layer.eval()(BIG_IDS[:2, :5])
    layer.backward(np.ones_like(out))                     # an eval forward has no mask
    np.testing.assert_allclose(layer.token.weight.grad, dense_lookup_grad(BIG_IDS[:2, :5], np.ones_like(out), 100))


def test_same_seed_same_weights_and_masks_different_seed_differs():
    a, b, c = big(seed=3), big(seed=3), big(seed=4)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        np.testing.assert_array_equal(va, vb)
    assert not np.array_equal(a.token.weight.data, c.token.weight.data)
    for _ in range(3):
        np.testing.assert_array_equal(a(BIG_IDS), b(BIG_IDS))
    c.load_state_dict(a.state_dict())
    assert not np.array_equal(a(BIG_IDS) != 0, c(BIG_IDS) != 0), "a different seed gives different masks"
    r1, r2 = big(seed=None, rng=np.random.default_rng(3)), big(seed=3)
    np.testing.assert_array_equal(r1(BIG_IDS), r2(BIG_IDS))


# -- structure -------------------------------------------------------------------------------------

@pytest.mark.parametrize("positional, kind, n_params, keys", [
    ("learned", "additive", 2, {"token.weight", "position.weight"}),
    ("sinusoidal", "additive", 1, {"token.weight"}),
    ("none", "none", 1, {"token.weight"}),
    (None, "none", 1, {"token.weight"}),
])
def test_schemes_parameters_and_keys(positional, kind, n_params, keys):
    layer = tpn.TransformerEmbedding(10, 4, 8, positional=positional, seed=0)
    assert layer.positional == (positional or "none")
    assert layer.position.kind == kind
    assert len(layer.parameters()) == n_params
    assert set(layer.state_dict()) == keys
    full = tpn.TransformerEmbedding(10, 4, 8, positional=positional, num_token_types=2, norm="layernorm", seed=0)
    assert set(full.state_dict()) == keys | {"token_type.weight", "norm.weight", "norm.bias"}
    assert len(full.parameters()) == n_params + 3
    rms = tpn.TransformerEmbedding(10, 4, 8, positional=positional, norm="rmsnorm", seed=0)
    assert set(rms.state_dict()) == keys | {"norm.weight"}


def test_positional_none_adds_nothing():
    layer = make("none", scale=True)
    np.testing.assert_allclose(layer(IDS), layer.token(IDS), rtol=0)
    assert isinstance(layer.position, tpn.NoPositionalEncoding)


def test_gradients_accumulate_across_calls():
    layer = make("learned")
    out = layer(IDS)
    layer.backward(np.ones_like(out))
    first = {n: p.grad.copy() for n, p in layer.named_parameters()}
    layer(IDS)
    layer.backward(np.ones_like(out))
    for n, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * first[n], rtol=1e-15)
    assert layer.token.weight.grad[3].tolist() == [6.0] * D     # id 3 used 3 times, 2 backward calls


def test_empty_batches():
    for positional in ("learned", "sinusoidal", "none"):
        layer = make(positional, dropout=0.5, norm="layernorm")
        for shape in [(0, 3), (2, 0), (0,)]:
            out = layer(np.zeros(shape, dtype=np.int64))
            assert out.shape == shape + (D,)
            layer.backward(np.zeros(out.shape))
        assert not layer.token.weight.grad.any()


# -- the kernels switch: the same results with the fused kernels on and off -----------------------

@pytest.fixture
def kernels_off():
    import tokenpos

    before = tokenpos.kernels_enabled()
    tokenpos.set_kernels(False)
    yield
    tokenpos.set_kernels(before)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_on_and_off_agree(positional, dtype, kernels_off):
    import tokenpos

    def step(enabled):
        tokenpos.set_kernels(enabled)
        layer = make(positional, scale=True, dropout=0.3, padding_idx=1, dtype=dtype, seed=11)
        out = layer(IDS, start_pos=1)
        layer.backward(np.random.default_rng(0).standard_normal(out.shape).astype(dtype))
        return out, {n: p.grad for n, p in layer.named_parameters()}

    out_off, g_off = step(False)
    out_on, g_on = step(True)
    np.testing.assert_array_equal(out_on == 0, out_off == 0), "dropout masks agree exactly"
    kw = TOL[f"forward.{np.dtype(dtype).name}"]
    np.testing.assert_allclose(out_on, out_off, **kw)
    for n in g_off:
        np.testing.assert_allclose(g_on[n], g_off[n], **TOL[f"grad.{np.dtype(dtype).name}"], err_msg=n)


def test_finite_differences_with_kernels_off(kernels_off):
    check_grads(lambda: make("learned", scale=True, dropout=0.3, padding_idx=1, seed=3), IDS,
                no_grad_rows={"token.weight": 1})


def test_sinusoidal_settings_travel_with_the_scheme_object():
    layer = make(tpn.SinusoidalPositionalEncoding(P, D, base=100.0, layout="half", dtype=np.float64))
    assert layer.position.base == 100.0 and layer.position.layout == "half"
    np.testing.assert_allclose(layer(IDS) - layer.token(IDS),
                               np.broadcast_to(sinusoidal_encoding(np.arange(4), D, base=100.0, layout="half"),
                                               (2, 4, D)), **TOL["forward.float64"])


# -- scheme objects, reset, kept inputs, big start_pos, float16 rounding ---------------------------

def test_a_rope_scheme_object_carries_its_settings():
    rope = tpn.RotaryEmbedding(4, base=500.0, scaling={"rope_type": "linear", "factor": 2.0}, interleaved=True)
    layer = tpn.TransformerEmbedding(V, 8, P, positional=rope, seed=0)
    assert layer.position is rope and layer.positional == "rope"
    np.testing.assert_array_equal(layer(IDS), layer.token(IDS)), "a rotary scheme adds nothing here"


@pytest.mark.parametrize("shortcut, heads, kind", [("rope", 2, "rotary"), ("alibi", 4, "bias"), ("t5", 2, "bias")])
def test_headed_shortcuts_are_built_from_num_heads(shortcut, heads, kind):
    layer = tpn.TransformerEmbedding(V, 8, P, positional=shortcut, num_heads=heads, seed=0)
    assert layer.position.kind == kind and layer.position.name == shortcut
    if shortcut == "rope":
        assert layer.position.head_dim == 8 // heads
    else:
        assert layer.position.num_heads == heads


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "t5", "none"])
def test_reset_parameters_redraws_every_table_from_one_generator(positional):
    a = tpn.TransformerEmbedding(V, 8, P, positional=positional, num_heads=2, num_token_types=2, norm="layernorm",
                                 seed=0)
    b = tpn.TransformerEmbedding(V, 8, P, positional=positional, num_heads=2, num_token_types=2, norm="layernorm",
                                 seed=1)
    a.norm.weight.data[...] = 3.0
    a.reset_parameters(seed=5)
    b.reset_parameters(seed=5)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)
    np.testing.assert_array_equal(a.norm.weight.data, 1.0)


def test_refilling_the_callers_ids_and_positions_before_backward_cannot_redirect_gradients(kernel_mode):
    layer = make("learned", dtype=np.float32)
    ids, pos = IDS.copy(), np.array([5, 4, 3, 2])
    out = layer(ids, pos)
    ids[...] = 0                                                           # the caller loads the next batch
    pos[...] = 0
    layer.backward(np.ones_like(out))
    assert set(np.flatnonzero(layer.token.weight.grad.any(axis=1))) == set(IDS.ravel().tolist())
    assert set(np.flatnonzero(layer.position.weight.grad.any(axis=1))) == {2, 3, 4, 5}


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("start_pos", [2**63 - 3, 2**63 - 1, 2**63, 2**64])
def test_start_pos_whose_positions_overflow_int64_is_a_position_error(positional, start_pos):
    layer = make(positional)
    with pytest.raises(tpn.PositionError, match=rf"start_pos {start_pos} with 4 positions overflows int64: the "
                                                rf"positions would run to {start_pos + 3}; expected start_pos \+ "
                                                rf"length <= {2**63 - 1}"):
        layer(IDS, start_pos=start_pos)


def test_start_pos_just_below_int64_max_is_a_range_error_for_learned_and_computed_for_sinusoidal():
    start = 2**63 - 5                                                      # start_pos + L = 2**63 - 1
    with pytest.raises(tpn.PositionError, match=rf"position {start} at index \(0, 0\) is out of range \[0, {P}\)"):
        make("learned")(IDS, start_pos=start)
    out = make("sinusoidal")(IDS, start_pos=start)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("positional", ["none", "learned", "sinusoidal"])
def test_float16_embedding_computes_in_float32_and_rounds_once(kernel_mode, positional):
    """COMMON rule: gather, widen to fp32, w * sqrt(D) (+ pos), dropout multiply, round once to fp16."""
    d = 3072
    layer = tpn.TransformerEmbedding(40, d, 8, positional=positional, scale=True, dropout=0.1, dtype=np.float16,
                                     seed=0)
    state = layer._rng.bit_generator.state
    ids = np.arange(32).reshape(4, 8)
    out = layer(ids)
    replay = np.random.default_rng()
    replay.bit_generator.state = state
    seed = int(replay.integers(0, (1 << 63) - 1, dtype=np.int64))
    x = layer.token.weight.data.astype(np.float32)[ids] * np.float32(math.sqrt(d))
    if positional != "none":
        x = x + layer.position.table.astype(np.float32)[np.arange(8)]
    keep = dropout_keep_mask(seed, x.shape, 0.1)
    np.testing.assert_array_equal(out, (x * np.where(keep, np.float32(1 / 0.9), np.float32(0))).astype(np.float16))
    if positional == "none":                                               # one rounding of the exact value
        exact = np.where(keep, layer.token.weight.data.astype(np.float64)[ids] * math.sqrt(d) / 0.9, 0.0)
        np.testing.assert_array_equal(out, exact.astype(np.float16))


def test_token_types_are_summed_in_hugging_faces_order(kernel_mode):
    """BERT: (W[ids] * s + T[tt]) + P[pos], bit for bit in float32 (the torch backend's order too)."""
    layer = tpn.TransformerEmbedding(V, D, P, scale=True, num_token_types=3, seed=0, init="standard_normal")
    w, t, p = (m.weight.data for m in (layer.token, layer.token_type, layer.position))
    expected = (w[IDS] * np.float32(math.sqrt(D)) + t[TT]) + p[np.arange(IDS.shape[1])]
    np.testing.assert_array_equal(layer(IDS, token_type_ids=TT), expected)
