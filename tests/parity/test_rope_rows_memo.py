"""RoPE's default call reads its cos / sin rows from a memo kept beside the layer's cache (``_rows``, both
backends): the memo must follow the cache. A new attention factor (a new cache key), a reset, a dtype cast (torch)
and a call past the cache (it grows) are each seen by the next call, as by the general protocol."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.call_budgets import K_SHAPE, Q_SHAPE

BACKENDS = {"numpy": (tpn, lambda x: np.asarray(x)), "torch": (tpt, lambda x: x.numpy())}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@torch.no_grad()
def test_the_rows_memo_follows_the_cache(backend: str) -> None:
    module, as_np = BACKENDS[backend]
    rng = np.random.default_rng(0)
    q_np, k_np = rng.standard_normal(Q_SHAPE, dtype=np.float32), rng.standard_normal(K_SHAPE, dtype=np.float32)
    q, k = (q_np, k_np) if backend == "numpy" else (torch.from_numpy(q_np), torch.from_numpy(k_np))
    layer = module.RotaryEmbedding(128, max_seq_len=64)

    def call(at: int, rope: Any = layer) -> list[bytes]:
        return [as_np(x).tobytes() for x in rope.apply(q, k, start_pos=at)]

    first = layer.apply(q, k, start_pos=7)
    layer.attention_factor = 0.5
    halved = layer.apply(q, k, start_pos=7)
    np.testing.assert_allclose(as_np(halved[0]), as_np(first[0]) * 0.5, rtol=1e-6, atol=1e-6)
    layer.attention_factor = 1.0
    layer.reset_parameters()
    assert call(7) == [as_np(x).tobytes() for x in first]
    if backend == "torch":
        layer.double().float()                                 # a cast reloads the tables: the memo follows
        assert call(7) == [as_np(x).tobytes() for x in first]
    grown = call(100)                                          # past the cache: it grows, the memo follows
    assert grown == call(100, module.RotaryEmbedding(128, max_seq_len=4096))
