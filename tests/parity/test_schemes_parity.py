"""NumPy <-> torch parity of the positional schemes and the attention that uses them: outputs and gradients.

Uses ``assert_fn_parity`` (tests/parity/helpers.py) with explicit callables: the NumPy side's hand-written
backward against torch autograd, relative to the output's scale ("parity.f32" / "parity.f64").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity.helpers import assert_fn_parity
from tokenpos.numpy.alibi import ALiBi as NpALiBi
from tokenpos.numpy.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from tokenpos.numpy.rotary import RotaryEmbedding as NpRotary
from tokenpos.numpy.t5_bias import T5RelativePositionBias as NpT5
from tokenpos.torch.alibi import ALiBi as TALiBi
from tokenpos.torch.attention import scaled_dot_product_attention as t_sdpa
from tokenpos.torch.rotary import RotaryEmbedding as TRotary
from tokenpos.torch.t5_bias import T5RelativePositionBias as TT5

DH = 8
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "attention_factor": 1.2},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.4, 1.6], "long_factor": [2.0, 3.0, 4.0, 5.0],
                 "original_max_position_embeddings": 4},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 4},
}
POSITIONS = {"none": {}, "start": {"start_pos": 9},
             "batch": {"positions": np.array([[0, 1, 2, 3, 4], [7, 3, 0, 1, 2]])}}
LAYOUTS = [(np.float32, False, None), (np.float64, True, None), (np.float32, True, 4), (np.float64, False, 4)]
# the longrope factor lists are sized for the full head, so longrope runs without partial rotary
ROTARY_CASES = [(n, d, i, r) for n in sorted(SCALINGS) for d, i, r in LAYOUTS if not (n == "longrope" and r)]


def _rand(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("pos_kind", sorted(POSITIONS))
@pytest.mark.parametrize(("name", "dtype", "interleaved", "rotary_dim"), ROTARY_CASES)
def test_rotary_apply_and_backward(name, pos_kind, dtype, interleaved, rotary_dim) -> None:
    kw = {"max_seq_len": 8, "scaling": SCALINGS[name], "interleaved": interleaved, "rotary_dim": rotary_dim}
    np_rope, t_rope = NpRotary(DH, **kw), TRotary(DH, **kw)
    q, k = _rand((2, 3, 5, DH), dtype, 0), _rand((2, 1, 5, DH), dtype, 1)
    np_kw = POSITIONS[pos_kind]
    t_kw = {key: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for key, v in np_kw.items()}
    assert_fn_parity(lambda a, b: np_rope.apply(a, b, **np_kw), np_rope.backward,
                     lambda a, b: t_rope.apply(a, b, **t_kw), (q, k))


@pytest.mark.parametrize("num_heads", [6, 8, 12, 16, 20])
def test_alibi_bias(num_heads: int) -> None:
    np_layer, t_layer = NpALiBi(num_heads, dtype=np.float32), TALiBi(num_heads, dtype=torch.float32)
    assert_fn_parity(lambda: np_layer.bias(4, 9), None, lambda: t_layer.bias(4, 9), ())


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_t5_bias_forward_and_weight_gradient(bidirectional: bool, dtype) -> None:
    kw = {"num_buckets": 8, "max_distance": 10, "bidirectional": bidirectional}
    np_layer = NpT5(3, dtype=dtype, seed=0, **kw)
    t_layer = TT5(3, dtype=getattr(torch, np.dtype(dtype).name), seed=1, **kw)
    t_layer.load_state_dict(np_layer.state_dict())
    assert_fn_parity(lambda: np_layer(5, 12), np_layer.backward, lambda: t_layer(5, 12), (),
                     np_params=dict(np_layer.named_parameters()), torch_params=dict(t_layer.named_parameters()))


def _t5_pair(dtype):
    np_layer = NpT5(2, num_buckets=8, max_distance=6, dtype=dtype, seed=0)
    t_layer = TT5(2, num_buckets=8, max_distance=6, dtype=getattr(torch, np.dtype(dtype).name), seed=1)
    t_layer.load_state_dict(np_layer.state_dict())
    return np_layer, t_layer


_ROPE_KW = {"max_seq_len": 8, "scaling": SCALINGS["yarn"], "rotary_dim": 6}
PAIRS = {  # name -> dtype -> (NumPy layer, torch layer), the torch one holding the NumPy one's state
    "none": lambda dtype: (None, None),
    "rope": lambda dtype: (NpRotary(DH, **_ROPE_KW), TRotary(DH, **_ROPE_KW)),
    "alibi": lambda dtype: (NpALiBi(2, dtype=dtype), TALiBi(2, dtype=getattr(torch, np.dtype(dtype).name))),
    "t5": _t5_pair,
}


@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
@pytest.mark.parametrize(("lq", "lk", "causal"), [(5, 5, True), (2, 6, True), (4, 4, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_forward_and_backward(name: str, lq: int, lk: int, causal: bool, dtype) -> None:
    np_layer, t_layer = PAIRS[name](dtype)
    q, k, v = _rand((2, 2, lq, DH), dtype, 2), _rand((2, 2, lk, DH), dtype, 3), _rand((2, 2, lk, DH), dtype, 4)
    mask = _rand((1, 1, lq, lk), dtype, 5)
    saved = {}

    def np_call(a, b, c):
        out, saved["cache"] = scaled_dot_product_attention_forward(a, b, c, positional=np_layer, causal=causal,
                                                                   attn_mask=mask)
        return out

    np_params = None if np_layer is None else dict(np_layer.named_parameters())     # T5's weight; {} for the rest
    t_params = None if t_layer is None else dict(t_layer.named_parameters())
    assert_fn_parity(np_call, lambda g: scaled_dot_product_attention_backward(g, saved["cache"]),
                     lambda a, b, c: t_sdpa(a, b, c, positional=t_layer, causal=causal,
                                            attn_mask=torch.from_numpy(mask)),
                     (q, k, v), np_params=np_params, torch_params=t_params)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal", "none", "rope", "alibi", "t5"])
def test_one_block_runs_every_scheme_in_both_backends(kind: str) -> None:
    """TransformerEmbedding(positional=kind) + one attention call written once: same numbers, same gradients."""
    import tokenpos.numpy as tpn
    import tokenpos.torch as tpt

    heads, d_model = 2, 16
    np_kw: dict = {"positional": kind, "num_heads": heads}
    t_kw = dict(np_kw)
    if kind == "t5":                          # a scheme object carries non-default settings in each backend
        t5 = {"num_buckets": 8, "max_distance": 12, "bidirectional": False}
        np_kw["positional"] = tpn.T5RelativePositionBias(heads, dtype=np.float64, seed=0, **t5)
        t_kw["positional"] = tpt.T5RelativePositionBias(heads, dtype=torch.float64, seed=1, **t5)
    np_emb = tpn.TransformerEmbedding(40, d_model, 16, dtype=np.float64, seed=0, **np_kw)
    t_emb = tpt.TransformerEmbedding(40, d_model, 16, dtype=torch.float64, seed=1, **t_kw)
    t_emb.load_state_dict(np_emb.state_dict())
    ids = np.array([[3, 7, 1, 9, 2], [4, 4, 8, 0, 5]])

    def heads_of(x):                                              # (B, L, D) -> (B, H, L, D / H)
        return x.reshape(2, 5, heads, d_model // heads).swapaxes(1, 2)

    x = np_emb(ids)
    out, cache = scaled_dot_product_attention_forward(heads_of(x), heads_of(x), heads_of(x), positional=np_emb.position)
    t_x = t_emb(torch.from_numpy(ids))
    t_out = t_sdpa(heads_of(t_x), heads_of(t_x), heads_of(t_x), positional=t_emb.position)
    np.testing.assert_allclose(t_out.detach().numpy(), out, rtol=1e-12, atol=1e-12)
    g = np.random.default_rng(0).standard_normal(out.shape)
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    np_emb.backward(((dq + dk + dv).swapaxes(1, 2)).reshape(2, 5, d_model))
    t_out.backward(torch.from_numpy(g))
    for name, p in t_emb.named_parameters():
        np_grad = dict(np_emb.named_parameters())[name].grad
        np.testing.assert_allclose(p.grad.numpy(), np_grad, rtol=1e-10, atol=1e-12, err_msg=name)
