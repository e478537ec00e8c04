"""The advice of the q / k length refusal (``tables.checks.rope.rope_length_message``) names a call that the
refusing layer accepts: every registered rotary layer of both backends is walked, refuses q and k of two
lengths, and then takes the call its message names (one-tensor ``rotate`` for a layer that has one, the
together-``apply`` with ``key_positions`` for one that rotates q and k together); the op's advice is its own.

Shapes: q (B, H, Lq, Dh), k (B, H, Lk, Dh) with Lq != Lk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tokenpos.tables import ConfigError
from tokenpos.tables.checks.rope import OP_LENGTH_ADVICE, ROTATE_EACH, ROTATE_TOGETHER
from tokenpos.tables.registry import BACKENDS, SCHEMES, ShortcutContext, scheme_class

CONTEXT = ShortcutContext(d_model=16, max_seq_len=32, num_heads=2)      # Dh = 8
DH, LQ, LK = 8, 3, 5
ROTARY = sorted(name for name, entry in SCHEMES.items() if entry.kind == "rotary")
# the positions a scheme's calls need (data keyed by name; default: None, i.e. start_pos + arange(L))
GRID = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 2)   # (6, 2) (row, col)
POSITIONS = {"rope2d": lambda length: GRID[:length]}


def _layer(name: str, backend: str) -> Any:
    return scheme_class(name, backend)(**SCHEMES[name].args(CONTEXT))


def _positions(name: str, length: int, backend: str) -> Any:
    make = POSITIONS.get(name)
    if make is None:
        return None
    pos = make(length)
    return torch.from_numpy(pos) if backend == "torch" else pos


def _qk(backend: str) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, LQ, DH)), rng.standard_normal((1, 2, LK, DH))
    return (torch.from_numpy(q), torch.from_numpy(k)) if backend == "torch" else (q, k)


def _close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


def test_the_walk_covers_every_rotary_layer_and_both_kinds_of_advice() -> None:
    together = {scheme_class(n, b).rotates_qk_together for n in ROTARY for b in BACKENDS}
    assert len(ROTARY) >= 4 and together == {True, False}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ROTARY)
def test_the_length_refusal_advises_a_call_the_layer_accepts(name: str, backend: str) -> None:
    layer = _layer(name, backend)
    q, k = _qk(backend)
    pos_q, pos_k = _positions(name, LQ, backend), _positions(name, LK, backend)
    with pytest.raises(ConfigError, match="q and k must have the same batch and length") as err:
        layer.apply(q, k, pos_q)
    message = str(err.value)
    assert ROTATE_EACH in message and ROTATE_TOGETHER in message
    if layer.rotates_qk_together:                                    # the advice for it: apply with key_positions
        assert "rotates_qk_together" in message
        keys = np.arange(LK) if backend == "numpy" else torch.arange(LK)
        q_rot, k_rot = layer.apply(q, k, pos_q, key_positions=keys)
        assert tuple(q_rot.shape) == tuple(q.shape) and tuple(k_rot.shape) == tuple(k.shape)
        if hasattr(layer, "rotate"):                                 # one tensor is refused: not the advice
            with pytest.raises(ConfigError, match=r"apply\(q, k, positions, key_positions=\.\.\.\)"):
                layer.rotate(q)
    else:                                                            # rotate(x, positions), one tensor at a time
        q_rot, k_rot = layer.rotate(q, pos_q), layer.rotate(k, pos_k)
        _close(q_rot, layer.apply(q, q, pos_q)[0])                   # the same rotation as the pair's
        _close(k_rot, layer.apply(k, k, pos_k)[0])


def test_the_op_refusal_advises_the_one_tensor_op() -> None:
    """``tokenpos::rope_qk`` given q and k of two lengths points at ``tokenpos::rope``, which takes each."""
    q, k = _qk("torch")
    cos, sin = torch.ones(LQ, DH // 2, dtype=torch.float64), torch.zeros(LQ, DH // 2, dtype=torch.float64)
    with pytest.raises(ConfigError) as err:
        torch.ops.tokenpos.rope_qk(q, k, cos, sin, False)
    assert str(err.value).endswith(OP_LENGTH_ADVICE)
    cos_k, sin_k = torch.ones(LK, DH // 2, dtype=torch.float64), torch.zeros(LK, DH // 2, dtype=torch.float64)
    torch.testing.assert_close(torch.ops.tokenpos.rope(k, cos_k, sin_k, False), k)   # angle 0: k itself
