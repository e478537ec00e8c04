"""Every ``positional=`` shortcut of ``tables.registry`` in both backends: the same weights from the same seed,
the same TransformerEmbedding output, and the same attention (outputs and gradients) with ``emb.position``.

Comparisons use ``tests/parity/helpers.py`` (relative to the output's scale, "parity.f32").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.parity.helpers import assert_fn_parity, compare
from tests.tolerances import TOL
from tokenpos.tables.registry import SCHEMES

V, D, P, H = 11, 16, 16, 2                         # Dh = 8; P = 16 is a 4 x 4 grid for sincos2d
SHORTCUTS = sorted(SCHEMES)

def pair(name: str, **kw):
    """The NumPy and torch TransformerEmbedding with shortcut ``name``, both from seed 0, in eval mode."""
    np_emb = tpn.TransformerEmbedding(V, D, P, positional=name, num_heads=H, seed=0, **kw)
    t_emb = tpt.TransformerEmbedding(V, D, P, positional=name, num_heads=H, seed=0, **kw)
    np_emb.eval()
    t_emb.eval()
    return np_emb, t_emb


@pytest.mark.parametrize("name", SHORTCUTS)
def test_the_same_seed_gives_the_same_weights(name):
    np_emb, t_emb = pair(name)
    assert type(np_emb.position).name == type(t_emb.position).name == name
    np_sd, t_sd = np_emb.position.state_dict(), t_emb.position.state_dict()
    assert sorted(np_sd) == sorted(t_sd)
    for key, value in np_sd.items():
        np.testing.assert_array_equal(t_sd[key].numpy(), value, err_msg=f"{name}: position.{key}")
    assert sorted(np_emb.state_dict()) == sorted(t_emb.state_dict())          # token.weight drawn first, same rng
    np.testing.assert_array_equal(t_emb.token.weight.detach().numpy(), np_emb.token.weight.data)


def test_learned_with_padding_positions_keeps_the_zero_row_in_both_backends():
    np_emb, t_emb = pair("learned", padding_idx=1, position_ids="padding")
    assert np_emb.position.padding_idx == t_emb.position.padding_idx == 1
    np.testing.assert_array_equal(t_emb.position.weight.detach().numpy(), np_emb.position.weight.data)
    assert not np_emb.position.weight.data[1].any()


@pytest.mark.parametrize("name", SHORTCUTS)
@pytest.mark.parametrize("call", [{}, {"start_pos": 3}], ids=["default", "start_pos"])
def test_transformer_embedding_forward_agrees(name, call):
    """Every shortcut, sincos2d's patch grid included, runs in the layer and agrees across backends;
    an additive table that does not extend refuses positions past its rows in both."""
    np_emb, t_emb = pair(name)
    ids = np.random.default_rng(1).integers(0, V, size=(2, 5))
    np_out = np_emb(ids, **call)
    t_out = t_emb(torch.from_numpy(ids), **call)
    assert np_out.shape == tuple(t_out.shape) == (2, 5, D)
    compare({}, "out", t_out, np_out, TOL["parity.f32"]["scale"])


# FIRE's out_bias adds the same value to every logit of a head, which the softmax cancels: its gradient is
# 0 up to rounding in both backends, so it is checked to be tiny rather than compared relative to itself.
SHIFT_ONLY = {"out_bias"}


GRID = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 2)   # (6, 2) (row, col)
# what a scheme's attention call needs beyond the defaults (data keyed by name, not a branch): 2-D RoPE has no
# default positions, it reads (row, col) patch positions; every other scheme (xPos too) takes the defaults
ATTENTION_POSITIONS = {"rope2d": lambda length: {"positions": GRID[:length]}}


def _attention_positions(name: str, length: int):
    make = ATTENTION_POSITIONS.get(name)
    return {} if make is None else make(length)


@pytest.mark.parametrize("name", SHORTCUTS)
def test_the_shortcut_scheme_in_attention_agrees(name):
    np_emb, t_emb = pair(name)
    L, dh = 6, D // H
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, H, L, dh)).astype(np.float32) for _ in range(3))
    np_kw = _attention_positions(name, L)
    t_kw = {key: torch.from_numpy(val) for key, val in np_kw.items()}
    caches = []

    def np_call(a, b, c):
        out, cache = tpn.scaled_dot_product_attention_forward(a, b, c, positional=np_emb.position, **np_kw)
        caches.append(cache)
        return out

    np_params, t_params = dict(np_emb.position.named_parameters()), dict(t_emb.position.named_parameters())
    assert sorted(np_params) == sorted(t_params)
    assert_fn_parity(np_call, lambda g: tpn.scaled_dot_product_attention_backward(g, caches[-1]),
                     lambda a, b, c: tpt.scaled_dot_product_attention(a, b, c, positional=t_emb.position, **t_kw),
                     (q, k, v), np_params={n: p for n, p in np_params.items() if n not in SHIFT_ONLY},
                     torch_params=t_params)
    for n in SHIFT_ONLY & set(np_params):
        assert np.abs(np_params[n].grad).max() < 1e-5 and t_params[n].grad.abs().max() < 1e-5, n


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_patch_grid_refuses_positions_past_its_rows(backend):
    from tokenpos.tables.errors import PositionError

    emb = pair("sincos2d")[0 if backend == "numpy" else 1]
    ids = np.zeros((1, 3), np.int64) if backend == "numpy" else torch.zeros((1, 3), dtype=torch.int64)
    with pytest.raises(PositionError, match="out of range"):
        emb(ids, start_pos=P - 2)
    assert emb.position(P).shape[0] == P and emb.position().shape == (P, D)
