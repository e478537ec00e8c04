"""Fixtures of the torch tests: a spy on the embedding op's kernel paths."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterator

import pytest

import tokenpos

# the module (the package attribute of the same name is the op)
embedding_op = importlib.import_module("tokenpos.torch.ops.embedding")


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of numba kernel runs inside ``tokenpos::embedding`` / ``embedding_backward``
    ("forward", "backward"); the kernel switch is restored afterwards."""
    counts: Counter[str] = Counter()
    for name, key in (("forward_rows", "forward"), ("_backward_numba", "backward")):
        fn = getattr(embedding_op, name)

        def spy(*args, _fn=fn, _key=key, **kwargs):  # type: ignore[no-untyped-def]
            counts[_key] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(embedding_op, name, spy)
    was = tokenpos.kernels_enabled()
    yield counts
    tokenpos.set_kernels(was)
