"""The light-call budgets (issue 47), one table for both backends: how many tokenpos functions, how many
distinct tokenpos lines, and how many lines of those functions' source one decode-sized call may run
(``tokenpos.analysis.calls.trace_call``: exact counts, not timings). ``tests/numpy/test_call_budgets.py``
and ``tests/torch/test_call_budgets.py`` hold each backend's calls to it.

| call (shapes of a decode step) | functions | lines | span of the functions |
| --- | ---: | ---: | ---: |
| ``TransformerEmbedding(learned)``, eval, ids (4, 1), start_pos=7 | 12 | 100 | |
| ``TokenEmbedding``, ids (4, 1) | 8 | 60 | |
| ``RotaryEmbedding.apply``, q (4, 32, 1, 128), k (4, 8, 1, 128), start_pos=7 | 12 | 100 | 200 |

A change that adds a function or a branch to one of these paths has to fit in them, or say in its pull
request why the budget moves. The counts are those of the default settings: kernels on, the library's own
size thresholds (the ``library_sizes`` fixture of ``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpos.analysis.calls import CallTrace, trace_call

V, D, P = 50257, 768, 1024            # the decode step's table sizes (GPT-2's)
Q_SHAPE, K_SHAPE = (4, 32, 1, 128), (4, 8, 1, 128)

BUDGETS: dict[str, tuple[int, int, int | None]] = {   # call -> (functions, distinct lines, span or None)
    "TransformerEmbedding": (12, 100, None),
    "TokenEmbedding": (8, 60, None),
    "RotaryEmbedding.apply": (12, 100, 200),
}


def assert_within_budget(name: str, call: Callable[[], object]) -> CallTrace:
    """Trace one ``call()`` (after a warm-up call) and assert it fits ``BUDGETS[name]``; returns the trace."""
    functions, lines, span = BUDGETS[name]
    trace = trace_call(call)
    assert len(trace.functions) <= functions, (len(trace.functions), trace.functions)
    assert trace.lines <= lines, (trace.lines, trace.functions)
    if span is not None:
        assert trace.span <= span, (trace.span, trace.functions)
    return trace
