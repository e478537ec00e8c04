"""8-bit (int8) tables: the NumPy and torch layers give the same rows, bit for bit, from one state_dict loaded
across backends in both directions, for TokenEmbedding, PerLayerEmbedding and HashedNgramEmbedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.ngram_cases import make_ids, settings
from tests.parity.helpers import assert_fn_parity

V, D, L, P = 19, 8, 3, 4
CASES = {
    "TokenEmbedding": ((V, D), {"scale": True, "padding_idx": 0}, np.random.default_rng(0).integers(0, V, (2, 6))),
    "PerLayerEmbedding": ((V, L, P), {}, np.random.default_rng(1).integers(0, V, (3, 5))),
    "HashedNgramEmbedding": ((), settings((3, 2, 6, [61, 53])), make_ids((2, 7))),
}


@pytest.mark.parametrize("load_from", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(CASES))
def test_int8_rows_equal_across_backends(name, dtype, load_from):
    args, kw, ids = CASES[name]
    seed = "init_seed" if name == "HashedNgramEmbedding" else "seed"      # different draws: the load must matter
    n = getattr(tpn, name)(*args, **{**kw, seed: 0}, dtype=getattr(np, dtype), weight_dtype=np.int8)
    t = getattr(tpt, name)(*args, **{**kw, seed: 1}, dtype=getattr(torch, dtype), weight_dtype=torch.int8)
    assert not np.array_equal(n.weight.data, t.weight.numpy())
    if load_from == "numpy":
        t.load_state_dict(n.state_dict())
    else:
        n.load_state_dict(t.state_dict())
    report = assert_fn_parity(n, None, t, (ids,))
    assert report.worst == 0.0
    np.testing.assert_array_equal(n(ids), t(torch.from_numpy(ids)).numpy())            # and bit for bit
