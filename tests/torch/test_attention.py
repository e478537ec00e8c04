"""tokenpos.torch scaled_dot_product_attention: one block for every scheme, cache decoding, compile, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenpos.numpy.attention import scaled_dot_product_attention as np_sdpa
from tokenpos.tables import ConfigError, PositionError
from tokenpos.torch.alibi import ALiBi
from tokenpos.torch.attention import scaled_dot_product_attention
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.t5_bias import T5RelativePositionBias

B, H, DH = 2, 2, 8


def schemes():
    return {
        "none": None,
        "rope": RotaryEmbedding(DH, max_seq_len=16, scaling={"rope_type": "linear", "factor": 2.0}),
        "alibi": ALiBi(H),
        "t5": T5RelativePositionBias(H, num_buckets=8, max_distance=6, bidirectional=False, seed=0),
    }


def data(lq: int, lk: int, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=gen).to(dtype) for s in ((B, H, lq, DH), (B, H, lk, DH), (B, H, lk, DH)))


@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_decoding_with_a_cache_equals_full_attention(name: str) -> None:
    layer = schemes()[name]
    q, k, v = data(6, 6)
    full = scaled_dot_product_attention(q, k, v, positional=layer)
    for t in range(1, 6):
        step = scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], positional=layer)
        torch.testing.assert_close(step[:, :, 0], full[:, :, t], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_compiles_without_graph_breaks(name: str) -> None:
    torch._dynamo.reset()
    layer = schemes()[name]
    q, k, v = data(3, 5)

    def fn(q, k, v):
        return scaled_dot_product_attention(q, k, v, positional=layer, start_pos=2)

    torch.testing.assert_close(torch.compile(fn, fullgraph=True, backend="eager")(q, k, v), fn(q, k, v),
                               rtol=0, atol=1e-6)


def test_gradients_reach_inputs_and_t5_weights() -> None:
    t5 = T5RelativePositionBias(H, num_buckets=8, max_distance=6, seed=0)
    q, k, v = (x.requires_grad_() for x in data(4, 4))
    scaled_dot_product_attention(q, k, v, positional=t5).square().sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v, t5.weight))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_runs_softmax_in_float32(dtype: torch.dtype) -> None:
    q, k, v = data(4, 4, dtype=dtype, seed=3)
    out = scaled_dot_product_attention(q, k, v, positional=ALiBi(H))
    ref = scaled_dot_product_attention(q.float(), k.float(), v.float(), positional=ALiBi(H))
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-2)


def test_masks_and_matches_numpy() -> None:
    q, k, v = data(4, 4, seed=5)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[0] = False
    out = scaled_dot_product_attention(q, k, v, causal=False, attn_mask=keep)
    ref = np_sdpa(q.numpy(), k.numpy(), v.numpy(), causal=False, attn_mask=keep.numpy())
    assert torch.all(out[:, :, 0] == 0)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    add = torch.randn(1, 1, 4, 4)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, attn_mask=add).numpy(),
                               np_sdpa(q.numpy(), k.numpy(), v.numpy(), attn_mask=add.numpy()), rtol=1e-5, atol=1e-6)


def test_errors_are_the_numpy_ones() -> None:
    q, k, v = data(4, 4)
    rope = RotaryEmbedding(DH)
    from tokenpos.numpy.rotary import RotaryEmbedding as NpRotary

    cases = [((q, k[:, :, :2], v[:, :, :2]), {}), ((q[:, :, :1], k, v), {"start_pos": 0}),
             ((q[:, :, :1], k, v), {"positions": torch.tensor([3])}),
             ((q[:, :, :1], k, v), {"positions": torch.tensor([3]), "key_positions": torch.arange(4), "start_pos": 3}),
             ((q, k, v), {"positions": torch.arange(4), "start_pos": 2})]
    for args, kwargs in cases:
        with pytest.raises((ConfigError, PositionError)) as t_err:
            scaled_dot_product_attention(*args, positional=rope, **kwargs)
        with pytest.raises((ConfigError, PositionError)) as n_err:
            np_sdpa(*(a.numpy() for a in args), positional=NpRotary(DH),
                    **{kk: (vv.numpy() if isinstance(vv, torch.Tensor) else vv) for kk, vv in kwargs.items()})
        assert type(t_err.value) is type(n_err.value) and str(t_err.value) == str(n_err.value)


@pytest.mark.parametrize("temperature", [None, (2, 0.7)], ids=["plain", "llama4-temperature"])
@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
def test_positions_take_start_pos_none_or_zero_only(name: str, temperature) -> None:
    """Given positions are used as they are: with them start_pos may be None (the default) or 0, also
    with a KV cache (Lq < Lk, key_positions) and with pre-rotated keys; another start_pos would be
    ignored, so it is a ConfigError whatever the scheme (the NumPy twin's text)."""
    layer = schemes()[name]
    q, k, v = data(2, 6, dtype=torch.float64, seed=7)
    kw = {"positional": layer, "attn_temperature": temperature}
    default = scaled_dot_product_attention(q, k, v, **kw)                       # queries at 4, 5 of 6 keys
    given = {"positions": torch.tensor([4, 5]), "key_positions": torch.arange(6)}
    for start in ({}, {"start_pos": None}, {"start_pos": 0}, {"start_pos": np.int64(0)}):
        torch.testing.assert_close(scaled_dot_product_attention(q, k, v, **kw, **given, **start), default,
                                   rtol=1e-12, atol=1e-12)
    for bad in (4, 1, -1):
        with pytest.raises(ConfigError, match=rf"^start_pos={bad} given with positions: positions are used as given, "
                                              r"so start_pos would be ignored; expected start_pos=None or 0"):
            scaled_dot_product_attention(q, k, v, **kw, **given, start_pos=bad)
    if getattr(layer, "kind", None) == "rotary" and not layer.rotates_qk_together:   # rotated keys: q alone
        k_rot = layer.rotate(k)
        by_start = scaled_dot_product_attention(q, k_rot, v, positional=layer, start_pos=4, rotate_keys=False)
        by_pos = scaled_dot_product_attention(q, k_rot, v, positional=layer, positions=torch.tensor([4, 5]),
                                              rotate_keys=False)
        torch.testing.assert_close(by_pos, by_start, rtol=1e-12, atol=1e-12)
        with pytest.raises(ConfigError, match="start_pos=4 given with positions"):
            scaled_dot_product_attention(q, k_rot, v, positional=layer, positions=torch.tensor([4, 5]), start_pos=4,
                                         rotate_keys=False)


def _same_error(t_fn, n_fn, cls) -> str:
    with pytest.raises(cls) as t_err:
        t_fn()
    with pytest.raises(cls) as n_err:
        n_fn()
    assert type(t_err.value) is type(n_err.value) and str(t_err.value) == str(n_err.value)
    return str(t_err.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_integer_and_bool_qkv_are_refused_in_both_backends(dtype: torch.dtype, which: int) -> None:
    from tokenpos.numpy.rotary import RotaryEmbedding as NpRotary
    from tokenpos.tables.errors import DtypeError

    qkv = list(data(4, 4))
    qkv[which] = (qkv[which] * 3).to(dtype)
    msg = _same_error(lambda: scaled_dot_product_attention(*qkv, positional=RotaryEmbedding(DH)),
                      lambda: np_sdpa(*(t.numpy() for t in qkv), positional=NpRotary(DH)), DtypeError)
    assert msg.startswith(f"{'qkv'[which]} must be a floating-point array, got dtype {str(dtype)[6:]}")


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "none", "learned"])
def test_a_scheme_name_instead_of_the_scheme_object_is_a_config_error(name: str) -> None:
    q, k, v = data(4, 4)
    msg = _same_error(lambda: scaled_dot_product_attention(q, k, v, positional=name),
                      lambda: np_sdpa(q.numpy(), k.numpy(), v.numpy(), positional=name), ConfigError)
    assert "emb.position" in msg


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_bias_scheme_head_count_mismatch_is_a_config_error(name: str) -> None:
    from tokenpos.numpy.alibi import ALiBi as NpALiBi
    from tokenpos.numpy.t5_bias import T5RelativePositionBias as NpT5

    q, k, v = data(4, 4)
    t_scheme, n_scheme = {"alibi": (ALiBi(H + 2), NpALiBi(H + 2)),
                          "t5": (T5RelativePositionBias(H + 2, num_buckets=8, seed=0),
                                 NpT5(H + 2, num_buckets=8, seed=0))}[name]
    msg = _same_error(lambda: scaled_dot_product_attention(q, k, v, positional=t_scheme),
                      lambda: np_sdpa(q.numpy(), k.numpy(), v.numpy(), positional=n_scheme), ConfigError)
    assert f"expected (H, Lq, Lk) = ({H}, 4, 4)" in msg


@pytest.mark.parametrize("shape", [(3, 4), (B, H + 1, 4, 4), (2, B, H, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_attn_mask_of_a_bad_shape_is_a_config_error(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    q, k, v = data(4, 4)
    mask = torch.ones(shape, dtype=dtype)
    _same_error(lambda: scaled_dot_product_attention(q, k, v, attn_mask=mask),
                lambda: np_sdpa(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask.numpy()), ConfigError)
