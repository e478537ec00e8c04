"""tokenpos._hugepages: the madvise request covers exactly the whole huge pages inside a region."""

from __future__ import annotations

import sys

import pytest
import torch

import tokenpos._hugepages as hp
import tokenpos.torch as tpt
from tokenpos.torch._init import empty_table


def test_the_request_covers_the_whole_huge_pages_inside_the_region(monkeypatch) -> None:
    asked: list[tuple[int, int, int]] = []
    monkeypatch.setattr(hp, "_MADVISE", [lambda a, n, advice: asked.append((a, n, advice)) or 0])
    H = hp.HUGE_PAGE
    assert hp.advise_huge_pages(3 * H + 100, 5 * H) is True                # [3H+100, 8H+100) -> [4H, 8H)
    assert asked == [(4 * H, 4 * H, hp.MADV_HUGEPAGE)]
    assert hp.advise_huge_pages(H + 1, hp.MIN_BYTES) is True               # [H+1, 3H+1) -> [2H, 3H)
    assert asked[-1][:2] == (2 * H, H)
    assert hp.advise_huge_pages(0, hp.MIN_BYTES - 1) is False              # small regions: left alone
    assert len(asked) == 2


def test_a_failed_or_missing_madvise_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(hp, "_MADVISE", [lambda a, n, advice: -1])
    assert hp.advise_huge_pages(0, 8 << 20) is False
    monkeypatch.setattr(hp, "_MADVISE", [None])                            # not Linux, or no libc symbol
    assert hp.advise_huge_pages(0, 8 << 20) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux-only here")
def test_large_torch_tables_are_advised_and_keep_their_values(monkeypatch) -> None:
    asked: list[int] = []
    real = hp.advise_huge_pages
    monkeypatch.setattr("tokenpos.torch._init.advise_huge_pages", lambda a, n: asked.append(n) or real(a, n))
    t = empty_table(2048, 1024)                                            # 8 MiB
    assert asked == [8 << 20] and t.is_cpu and t.shape == (2048, 1024)
    a = tpt.TokenEmbedding(4096, 512, seed=3)                              # 8 MiB, advised
    b = tpt.TokenEmbedding(4096, 512, seed=3)
    assert torch.equal(a.weight, b.weight)                                 # the same init, whatever the pages
    empty_table(4, 4, device="meta")                                       # other devices: no request
    assert len(asked) == 3
