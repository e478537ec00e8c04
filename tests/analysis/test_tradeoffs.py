"""The positional trade-off numbers are computed, and say what the library does."""

from __future__ import annotations

import pytest

from tokenpos.analysis.tradeoffs import positional_tradeoffs


@pytest.fixture(scope="module")
def tradeoffs():
    return positional_tradeoffs(max_seq_len=128, d_model=64, num_heads=4, head_dim=32)


def test_memory_rows(tradeoffs) -> None:
    mem = {name: params for name, params, _, _ in tradeoffs.memory}
    assert mem["learned"] == 128 * 64
    assert mem["sinusoidal"] == mem["rope"] == mem["alibi"] == mem["none"] == 0
    assert mem["t5"] == 32 * 4


def test_extrapolation_findings(tradeoffs) -> None:
    ex = {e.scheme: e for e in tradeoffs.extrapolation}
    from tokenpos.tables.registry import SHORTCUTS

    assert set(ex) == set(SHORTCUTS)                         # every registered scheme, fire and kerple included
    assert ex["learned"].beyond_max == "refused"
    assert "PositionError" in ex["learned"].finding and "128" in ex["learned"].finding
    assert ex["sinusoidal"].beyond_max == "computed"
    assert "add 0 new ones" in ex["t5"].finding             # max_distance 128 <= L: no new bucket past L


def test_variance_rows(tradeoffs) -> None:
    sin, learned, xavier, token, scaled, sincos2d = tradeoffs.variance
    assert sincos2d.name == "sincos2d, 11 x 11 patch grid" and 0 < sincos2d.mean <= 1
    assert sin.name == "sinusoidal" and "N(0, 0.02)" in learned.name and "xavier" in xavier.name
    assert sin.mean > 100 * learned.mean
    assert learned.mean == pytest.approx(0.02 ** 2, rel=0.15)
    assert xavier.mean == pytest.approx(2 / (128 + 64), rel=0.15)       # U(-a, a): a^2 / 3 = 2 / (L + D)
    assert scaled.mean == pytest.approx(64 * token.mean)
    assert 0 <= sin.frac_low <= 1
    assert len(tradeoffs.summary) == 3 and all(tradeoffs.summary)


def test_progress_reaches_total() -> None:
    calls = []
    positional_tradeoffs(max_seq_len=64, d_model=32, progress=lambda s, d, t: calls.append((s, d, t)))
    assert calls[-1] == ("trade-off analysis", 3, 3)
