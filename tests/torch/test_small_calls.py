"""Small eager embedding calls (``ops.entry.SMALL_BYTES``): torch's own gather, exact to the fused kernel.

An eager call without autograd or dropout whose output is under ``SMALL_BYTES`` runs ``ops.embedding.formula``
(``torch.embedding``, then the kernel's arithmetic in its order); every other call runs the kernel. The suite
runs every call through the kernel by default (``tests/conftest.py``); here the library's own threshold
holds, and the two paths are compared bit for bit on the same calls.
"""

from __future__ import annotations

import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tokenpos.tables.errors import PositionError, TokenIdError
from tokenpos.torch.ops import entry


@pytest.fixture(autouse=True)
def _library_defaults(library_sizes) -> None:
    """The library's own size thresholds."""


def _both(monkeypatch: pytest.MonkeyPatch, fn):
    """fn() on the small path (the library's threshold) and on the kernel (threshold 0), kernels on."""
    small = fn()
    with monkeypatch.context() as mp:
        mp.setattr(entry, "SMALL_BYTES", 0)
        kernel = fn()
    return small, kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("positional, scale", [("learned", False), ("learned", True), ("sinusoidal", True),
                                               ("rope", False), ("none", True)])
def test_the_small_path_equals_the_kernel_bit_for_bit(monkeypatch, dtype, positional, scale) -> None:
    layer = tpt.TransformerEmbedding(97, 24, 32, positional=positional, num_heads=4, scale=scale,
                                     dtype=dtype, seed=0).eval()
    ids = torch.randint(0, 97, (3, 2), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        small, kernel = _both(monkeypatch, lambda: layer(ids, start_pos=5))
    assert small.dtype == kernel.dtype == dtype and small.shape == (3, 2, 24)
    assert torch.equal(small, kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_table_call_is_torchs_gather(monkeypatch, dtype) -> None:
    """The small path is ``torch.embedding`` itself (one call, no kernel), and equals the kernel."""
    layer = tpt.TokenEmbedding(50, 8, scale=True, dtype=dtype, seed=0)
    ids = torch.tensor([[3, 49], [0, 7]])
    calls = []
    real = torch.embedding

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    with torch.no_grad():
        monkeypatch.setattr(torch, "embedding", spy)
        small = layer(ids)
        monkeypatch.setattr(torch, "embedding", real)
        assert calls == [ids.shape]
        _, kernel = _both(monkeypatch, lambda: layer(ids))
    assert torch.equal(small, kernel)


def test_autograd_and_dropout_take_the_kernel(monkeypatch) -> None:
    """A call that needs a gradient or draws a dropout mask never takes the small path."""
    called = []
    monkeypatch.setattr(entry, "formula", lambda *a: called.append(1) or None)
    layer = tpt.TransformerEmbedding(50, 8, 16, dropout=0.5, seed=0)
    ids = torch.tensor([[1, 2]])
    layer(ids).sum().backward()                                   # training, autograd, dropout
    with torch.no_grad():
        layer(ids)                                                # training, dropout
    assert called == [] and layer.token.weight.grad is not None


@pytest.mark.parametrize("bad, error, text", [
    (torch.tensor([[4], [50]]), TokenIdError, r"^token id 50 at index \(1, 0\) is out of range \[0, 50\)$"),
    (torch.tensor([[-1], [2]]), TokenIdError, r"^token id -1 at index \(0, 0\) is out of range \[0, 50\)$"),
    (torch.tensor([[4], [50]], dtype=torch.int32), TokenIdError, r"^token id 50 at index \(1, 0\)"),
])
def test_bad_ids_on_the_small_path_raise_the_shared_error(monkeypatch, bad, error, text) -> None:
    layer = tpt.TransformerEmbedding(50, 8, 16, seed=0).eval()
    for kernels in (True, False):
        with tokenpos.use_kernels(kernels), torch.no_grad():
            small, kernel = [], []
            for out, threshold in ((small, entry.SMALL_BYTES), (kernel, 0)):
                with monkeypatch.context() as mp:
                    mp.setattr(entry, "SMALL_BYTES", threshold)
                    with pytest.raises(error, match=text) as err:
                        layer(bad, start_pos=3)
                    out.append((type(err.value), str(err.value)))
            assert small == kernel


def test_a_position_past_the_table_is_named_before_the_gather() -> None:
    layer = tpt.TransformerEmbedding(50, 8, 16, seed=0).eval()
    with torch.no_grad(), pytest.raises(PositionError, match=r"out of range \[0, 16\)"):
        layer(torch.tensor([[1]]), start_pos=16)
    with torch.no_grad(), pytest.raises(TokenIdError, match=r"token id 99"):       # a bad id first
        layer(torch.tensor([[99]]), start_pos=16)


def test_the_op_called_directly_names_a_bad_id_on_torchs_gather() -> None:
    """``ops.embedding.formula`` turns torch's IndexError into the kernel's ``KernelBoundError`` (the same
    text as the kernel's first part), so an op on any path names the value, the index and the range."""
    from tokenpos.tables.errors import KernelBoundError
    from tokenpos.torch.ops.embedding import formula

    w = torch.randn(5, 3)
    with pytest.raises(KernelBoundError, match=r"^token id 7 at index \(1,\) is out of range \[0, 5\): .*refused"):
        formula(w, torch.tensor([1, 7]), None, None, 1.0, 0.0, None, -1)
    with pytest.raises(KernelBoundError, match=r"^position 9 at index \(0,\) is out of range \[0, 4\)"):
        formula(w, torch.tensor([1, 2]), torch.randn(4, 3), torch.tensor([9, 0]), 1.0, 0.0, None, -1)
