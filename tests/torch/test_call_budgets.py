"""The light-call budgets (issue 47): how many tokenpos functions, and how many distinct tokenpos lines, one
decode-sized call runs, eval, no grad (``tokenpos.analysis.calls.trace_call``: exact counts, not timings).

| call (shapes of a decode step) | functions | lines | span of the functions |
| --- | ---: | ---: | ---: |
| ``TransformerEmbedding(learned)``, ids (4, 1), start_pos=7 | 12 | 100 | |
| ``TokenEmbedding``, ids (4, 1) | 8 | 60 | |
| ``RotaryEmbedding.apply``, q (4, 32, 1, 128), k (4, 8, 1, 128), start_pos=7 | 12 | 100 | 200 |

A change that adds a function or a branch to one of these paths has to fit in them, or say in its pull
request why the budget moves. What a call costs in host time against the torch way is measured by
``tokenpos bench --cases calls`` (never timed here). The counts do not depend on the kernels' switch for the
embedding rows (a small call is torch's gather either way); RoPE's row is the default, kernels on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import tokenpos.torch as tpt
from tokenpos.analysis.calls import trace_call

V, D, P = 50257, 768, 1024


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
    q, k = torch.randn(4, 32, 1, 128, generator=g), torch.randn(4, 8, 1, 128, generator=g)
    return lambda: layer.apply(q, k, start_pos=7)


BUDGETS = {                    # name -> (call, most functions, most distinct lines, most lines of the functions)
    "TransformerEmbedding": (_transformer, 12, 100, None),
    "TokenEmbedding": (_token, 8, 60, None),
    "RotaryEmbedding.apply": (_rope, 12, 100, 200),
}


@pytest.fixture(autouse=True)
def _library_defaults(library_sizes) -> None:
    """The calls as a user makes them: the library's own size thresholds, not the test suite's."""


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_decode_sized_call_fits_its_budget(name: str) -> None:
    make, functions, lines, span = BUDGETS[name]
    with torch.no_grad():
        trace = trace_call(make())
    assert len(trace.functions) <= functions, (len(trace.functions), trace.functions)
    assert trace.lines <= lines, (trace.lines, trace.functions)
    if span is not None:
        assert trace.span <= span, (trace.span, trace.functions)


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
    with torch.no_grad(), pytest.raises(TokenIdError, match=r"^token id 50 at index \(1, 0\) is out of range \[0, 50\)"):
        layer(torch.tensor([[3], [50]]), start_pos=7)
    assert all(torch.equal(v, layer.state_dict()[k]) for k, v in before.items())
