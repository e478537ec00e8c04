"""HashedNgramEmbedding: NumPy and torch give the same outputs and table gradients (state loaded across
backends both ways), for (B, L) ids, packed ids with cu_seqlens, and a decoding context, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ngram_cases import CASES, make_ids, settings
from tests.parity.helpers import assert_parity


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("load_from", ["numpy", "torch"])
def test_batch_parity(case, dtype, load_from):
    kw = {**settings(case, 15), "dtype": dtype}
    assert_parity("HashedNgramEmbedding", (), kw, args=(make_ids((3, 7)),), load_from=load_from)


@pytest.mark.parametrize("case", CASES[1:])
def test_packed_and_context_parity(case):
    kw = {**settings(case, 1), "dtype": "float64"}
    c = case[0] - 1
    cu = np.array([0, 2, 2, 9, 12])
    assert_parity("HashedNgramEmbedding", (), kw, args=(make_ids((12,)),),
                  kwargs={"cu_seqlens": cu, "context": make_ids((4, c), seed=4)})
    assert_parity("HashedNgramEmbedding", (), kw, args=(make_ids((2, 3)),), kwargs={"context": make_ids((2, c))})
