"""End-to-end training in NumPy: Adam learns a lookup task; SGD changes only the rows it used."""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.numpy import optim


def mse(out, target):
    diff = out.astype(np.float64) - target
    return float(np.mean(diff**2)), (2.0 * diff / diff.size).astype(out.dtype)


@pytest.mark.slow  # trains to convergence
@pytest.mark.parametrize("mode", ["exact", "lazy"])
def test_adam_learns_a_lookup_task(mode):
    V, D = 32, 8
    rng = np.random.default_rng(0)
    targets = rng.standard_normal((V, D))
    layer = tpn.TokenEmbedding(V, D, seed=0)
    opt = optim.Adam(layer.parameters(), lr=0.05, sparse_mode=mode)
    first = None
    for _ in range(300):
        ids = rng.integers(0, V, size=(4, 8))
        opt.zero_grad()
        out = layer(ids)
        loss, g = mse(out, targets[ids])
        first = loss if first is None else first
        layer.backward(g)
        opt.step()
    final, _ = mse(layer(np.arange(V)), targets)
    assert first > 0.5
    assert final < 1e-3, f"Adam ({mode}) reached only {final:.2e}"


@pytest.mark.slow  # trains to convergence
def test_adamw_trains_the_whole_input_block():
    """Targets depend on the token and on the position: token and learned position tables must both learn."""
    V, D, L = 20, 6, 5
    rng = np.random.default_rng(1)
    tok_t, pos_t = rng.standard_normal((V, D)), rng.standard_normal((L, D))
    layer = tpn.TransformerEmbedding(V, D, L, positional="learned", scale=True, dropout=0.0, seed=0)
    opt = optim.AdamW(layer.parameters(), lr=0.03, weight_decay=0.0, sparse_mode="lazy")
    for _ in range(400):
        ids = rng.integers(0, V, size=(8, L))
        opt.zero_grad()
        out = layer(ids)
        _, g = mse(out, tok_t[ids] + pos_t)
        layer.backward(g)
        opt.step()
    layer.eval()
    ids = np.arange(V * L).reshape(V, L) % V
    final, _ = mse(layer(ids), tok_t[ids] + pos_t)
    assert final < 5e-3, f"reached only {final:.2e}"


def test_sgd_changes_only_the_rows_used():
    V, D, P = 50, 4, 16
    rng = np.random.default_rng(2)
    layer = tpn.TransformerEmbedding(V, D, P, positional="learned", dropout=0.2, padding_idx=0, seed=0)
    before = layer.state_dict()
    opt = optim.SGD(layer.parameters(), lr=0.1)
    used = set()
    for _ in range(20):
        ids = rng.choice([0, 3, 5, 8, 13, 21], size=(2, 6))   # a small vocabulary slice, with padding
        used |= set(ids.reshape(-1).tolist())
        opt.zero_grad()
        out = layer(ids)
        layer.backward(rng.standard_normal(out.shape).astype(out.dtype))
        opt.step()
    after = layer.state_dict()
    tok_changed = set(np.flatnonzero(np.any(after["token.weight"] != before["token.weight"], axis=1)).tolist())
    assert tok_changed == used - {0}, "exactly the ids used, minus the padding row"
    assert not after["token.weight"][0].any()
    pos_changed = np.flatnonzero(np.any(after["position.weight"] != before["position.weight"], axis=1))
    np.testing.assert_array_equal(pos_changed, np.arange(6))
