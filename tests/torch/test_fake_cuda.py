"""The fake CUDA helper (tests/torch/fake_cuda.py) skips, never fails, where it cannot run: without Triton
(the optional gpu extra) as on a GPU machine whose Triton compiles (issue 48, item 11)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.torch import fake_cuda


@pytest.mark.parametrize("use", ["to_fake_cuda", "no_host_sync", "fake_cuda"])
def test_every_entry_skips_without_triton(monkeypatch: pytest.MonkeyPatch, use: str) -> None:
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)            # import triton -> ImportError
    with pytest.raises(pytest.skip.Exception, match="Triton"):
        if use == "to_fake_cuda":
            fake_cuda.to_fake_cuda(torch.zeros(2))
        else:
            with getattr(fake_cuda, use)():
                pass
    assert fake_cuda.unavailable() is not None


def test_runs_where_triton_interprets() -> None:
    if fake_cuda.unavailable() is not None:
        pytest.skip(str(fake_cuda.unavailable()))
    x = fake_cuda.to_fake_cuda(torch.arange(3.0))
    assert x.device.type == "cuda" and torch.equal(fake_cuda.cpu_of(x), torch.arange(3.0))
