"""``tokenpos bench``'s packed rows: forward and rope time the public layers on the same B * L tokens
packed in one row (timings themselves are never asserted)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tests.analysis.test_bench import TINY  # noqa: E402
from tokenpos.analysis import bench_cases  # noqa: E402


def test_packed_cu_seqlens_cover_the_same_tokens() -> None:
    assert bench_cases.packed_cu_seqlens(2, 8).tolist() == [0, 4, 8, 12, 16]
    assert bench_cases.packed_cu_seqlens(3, 5)[-1] == 15


@pytest.mark.parametrize("case", ["forward", "rope"])
def test_packed_rows_are_timed_not_skipped(case: str) -> None:
    rows = (bench_cases.embedding_case(TINY, 0.0, reps=2, compile_=False) if case == "forward"
            else bench_cases.rope_case(TINY, reps=2, compile_=False))
    packed = {r.impl: r for r in rows if bench_cases.PACKED in r.impl}
    assert set(packed) == {f"tokenpos {b}, packed documents (public layer)" for b in ("numpy", "torch")}
    assert all(r.seconds > 0 and r.ratio_vs_kernel > 0 for r in packed.values()), packed
