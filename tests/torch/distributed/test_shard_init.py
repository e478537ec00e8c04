"""One-process pieces of the vocab-parallel package: TP-invariant shard init, and a clear error without a group."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.init import init_weight
from tokenpos.torch.distributed import VocabParallelEmbedding, _shard_init, vocab_parallel_cross_entropy


@given(V=st.integers(1, 40), D=st.integers(1, 6), W=st.integers(1, 5), block=st.integers(1, 50),
       scheme=st.sampled_from(["normal", "trunc_normal", "xavier_uniform", "standard_normal", "zeros"]),
       pad=st.booleans())
def test_shards_concatenate_to_the_one_process_table(V: int, D: int, W: int, block: int, scheme: str,
                                                     pad: bool) -> None:
    padding_idx = V // 2 if pad else None
    full = init_weight((V, D), scheme, std=0.3, rng=np.random.default_rng(11), padding_idx=padding_idx)
    per = -(-V // W)
    old = _shard_init.BLOCK_VALUES
    _shard_init.BLOCK_VALUES = block                     # small blocks: the row-block draw is exercised
    try:
        shards, states = [], []
        for r in range(W):
            rng = np.random.default_rng(11)
            shards.append(_shard_init.shard_init(V, D, r * per, (r + 1) * per, scheme, std=0.3, rng=rng,
                                                 padding_idx=padding_idx))
            states.append(rng.bit_generator.state["state"]["state"])
    finally:
        _shard_init.BLOCK_VALUES = old
    table = np.concatenate(shards)
    np.testing.assert_array_equal(table[:V], full)       # bit for bit
    assert not table[V:].any()                           # padding rows
    after = np.random.default_rng(11)
    init_weight((V, D), scheme, std=0.3, rng=after)
    assert set(states) == {after.bit_generator.state["state"]["state"]}   # the generator ends where one process's does


def test_without_a_process_group_the_error_says_what_to_do() -> None:
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="init_process_group"):
        VocabParallelEmbedding(10, 4, seed=0)
    with pytest.raises(ConfigError, match="init_process_group"):
        vocab_parallel_cross_entropy(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long))
