"""The light-call budgets of the torch backend (the table and its rule: ``tests/call_budgets.py``). What a call
costs in host time against the torch way is measured by ``tokenpos bench --cases calls`` (never timed here).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import tokenpos.torch as tpt
from tests.call_budgets import BUDGETS, K_SHAPE, Q_SHAPE, D, P, V, assert_within_budget
from tokenpos.analysis.calls import trace_call


def _transformer() -> Callable[[], object]:
    layer = tpt.TransformerEmbedding(V, D, P, positional="learned", seed=0).eval()
    ids = torch.randint(0, V, (4, 1), generator=torch.Generator().manual_seed(0))
    return lambda: layer(ids, start_pos=7)


def _token() -> Callable[[], object]:
    layer = tpt.TokenEmbedding(V, D, seed=0)
    ids = torch.randint(0, V, (4, 1), generator=torch.Generator().manual_seed(0))
    return lambda: layer(ids)


def _rope() -> Callable[[], object]:
    layer = tpt.RotaryEmbedding(128, max_seq_len=4096)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(Q_SHAPE, generator=g), torch.randn(K_SHAPE, generator=g)
    return lambda: layer.apply(q, k, start_pos=7)


pytestmark = pytest.mark.usefixtures("library_sizes")   # the calls as a user makes them: the library's sizes
CALLS = {"TransformerEmbedding": _transformer, "TokenEmbedding": _token, "RotaryEmbedding.apply": _rope}


@pytest.mark.slow  # traces every call
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_decode_sized_call_fits_its_budget(name: str) -> None:
    with torch.no_grad():
        assert_within_budget(name, CALLS[name]())


def test_the_default_rope_call_is_one_file_of_the_layer_then_the_op() -> None:
    """A reader follows q from ``apply`` to the kernel: the layer's own file, its table cache, the layout view,
    then the op's entry, implementation and kernel; nothing of the general protocol (given positions, packed
    rows, key positions) on the way."""
    with torch.no_grad():
        trace = trace_call(_rope())
    entered = set(trace.functions)
    assert {"torch/rotary.py:RotaryEmbedding.apply", "torch/_rope_tables.py:RopeTables._rows",
            "torch/_rotary_base.py:to_bhld", "torch/ops/entry.py:rotate_qk", "kernels/rope.py:run_rope"} <= entered
    assert not any(".RotaryBase." in f or "_pairs_range" in f or "_variant" in f for f in entered), entered


def test_a_bad_id_on_the_light_path_is_still_named_and_changes_nothing() -> None:
    """The light path reads the ids where it gathers them; the error is the shared one, before any output."""
    from tokenpos.tables.errors import TokenIdError

    layer = tpt.TransformerEmbedding(50, 8, 16, seed=0).eval()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    message = r"^token id 50 at index \(1, 0\) is out of range \[0, 50\)"
    with torch.no_grad(), pytest.raises(TokenIdError, match=message):
        layer(torch.tensor([[3], [50]]), start_pos=7)
    assert all(torch.equal(v, layer.state_dict()[k]) for k, v in before.items())
