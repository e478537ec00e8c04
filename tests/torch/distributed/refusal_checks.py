"""Rank checks of every value API.md says the vocab-parallel losses refuse, on both devices (the CPU, and fake
CUDA: ``tests/torch/fake_cuda.py``), at every world size ``test_refusals.py`` starts (1, 2, 3); of label
smoothing without ``vocab_size=`` (issue 48, items 1 and 5); of repeated backwards and gradcheck (item 3); and of
h and tables of two dtypes (item 9).

API.md: "A target outside [0, vocab_size) that is not ignore_index raises" (``vocab_parallel_cross_entropy`` and
``VocabParallelEmbedding.loss``). The class of defect: a refused value that some path lets through as a number
(a target in a padding column gave a silent ``inf`` when ``vocab_size=`` was not passed). So every refused
value (below 0, the first padding column, the last padding column, the padded size, far out) is tried

- with and without ``vocab_size=`` (without it, the padding columns are known from their -inf logits), and
  smoothed,
- through ``vocab_parallel_cross_entropy(attend(h))`` and ``VocabParallelEmbedding.loss``,
- on the CPU (a ``TokenIdError`` naming the value, on every rank, the group still usable after) and on fake
  CUDA (a device-side assert, with no host sync: ``no_host_sync``; the all-reduces of the fake tensors run on
  their CPU data, as NCCL's would on the device without the host waiting).

Shapes: V = 1003 real tokens padded to a multiple of 8 * W, D = 4, h (2, 3, D).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from tests.torch.distributed.harness import SKIP, CheckResults, run_checks
from tests.torch.fake_cuda import HostSync, cpu_of, fake_cuda, no_host_sync, to_fake_cuda, unavailable
from tokenpos.tables.errors import ConfigError, DtypeError, StateDictError, TokenIdError
from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy

V, D, PAD = 1003, 4, 8


def _emb() -> VocabParallelEmbedding:
    return VocabParallelEmbedding(V, D, seed=3, pad_to_multiple_of=PAD)


def _h() -> torch.Tensor:
    return torch.randn(2, 3, D, generator=torch.Generator().manual_seed(4))


def refused_targets(emb: VocabParallelEmbedding) -> list[int]:
    """Every kind of target the losses refuse: below 0, the padding columns' first and last, past them."""
    Vp = emb.padded_vocab_size
    assert Vp > V, "the table must be padded for this sweep"
    return [-1, V, Vp - 1, Vp, 10 * Vp]


def _targets(bad: int) -> torch.Tensor:
    t = torch.tensor([[0, V - 1, 5], [-100, 7, 9]])
    t[1, 1] = bad
    return t


CALLS: dict[str, Callable[[VocabParallelEmbedding, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "ce_vocab_size": lambda emb, h, t: vocab_parallel_cross_entropy(emb.attend(h), t, vocab_size=emb.vocab_size),
    "ce_no_vocab_size": lambda emb, h, t: vocab_parallel_cross_entropy(emb.attend(h), t),
    "ce_vocab_size_smoothed": lambda emb, h, t: vocab_parallel_cross_entropy(emb.attend(h), t, label_smoothing=0.1,
                                                                             vocab_size=emb.vocab_size),
    "loss": lambda emb, h, t: emb.loss(h, t),
}


def check_refused_on_cpu(call: str) -> None:
    emb, h = _emb(), _h()
    fn = CALLS[call]
    for bad in refused_targets(emb):
        try:
            out = fn(emb, h, _targets(bad))
        except TokenIdError as e:
            assert f"target {bad} at index (1, 1)" in str(e), str(e)
        else:
            raise AssertionError(f"{call}: target {bad} gave {out} instead of a TokenIdError")
    good = fn(emb, h, _targets(V - 1))                  # the group still works after the refusals
    assert torch.isfinite(good), good


@contextmanager
def _collectives_on_cpu_data() -> Iterator[None]:
    """The all-reduces of fake CUDA tensors run on their CPU data (in place), outside the detector."""
    real = dist.all_reduce

    def on_data(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return real(cpu_of(t), *args, **kwargs)

    with mock.patch.object(dist, "all_reduce", on_data):
        yield



def check_refused_on_fake_cuda(call: str) -> None:
    reason = unavailable()
    if reason is not None:                      # reported as a skip by test_refusals.py
        raise RuntimeError(SKIP + reason)
    with fake_cuda():
        emb = VocabParallelEmbedding(V, D, seed=3, pad_to_multiple_of=PAD, device="cuda")
    h = _h()
    fn = CALLS[call]
    with _collectives_on_cpu_data():
        for bad in refused_targets(emb):
            try:
                with no_host_sync():
                    fn(emb, to_fake_cuda(h), to_fake_cuda(_targets(bad)))
            except HostSync:
                raise
            except RuntimeError as e:
                assert "device-side assert" in str(e), str(e)
            else:
                raise AssertionError(f"{call}: target {bad} on CUDA passed without a device-side failure")
        with no_host_sync():
            good = fn(emb, to_fake_cuda(h), to_fake_cuda(_targets(V - 1)))
    assert torch.isfinite(cpu_of(good)), good


def check_smoothing_without_vocab_size() -> None:
    """Label smoothing without vocab_size=: over padded shards (attend's -inf columns) refused on every rank with the
    ConfigError naming vocab_size= (API.md), on fake CUDA a device-side assert and no host sync; over shards that
    are not padded never refused (issue 48 item 5), equal to F.cross_entropy, loss and gradient."""
    world = dist.get_world_size()
    emb = VocabParallelEmbedding(V, D, seed=5, pad_to_multiple_of=PAD)
    h = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(6))
    t = torch.tensor([[0, V - 1, -100], [3, 7, 9]])
    with pytest.raises(ConfigError, match="vocab_size="):
        vocab_parallel_cross_entropy(emb.attend(h), t, label_smoothing=0.1)
    if unavailable() is None:                   # fake CUDA: one device-side assert, no host sync
        with fake_cuda():
            cuda_emb = VocabParallelEmbedding(V, D, seed=5, pad_to_multiple_of=PAD, device="cuda")
        with _collectives_on_cpu_data():
            try:
                with no_host_sync():
                    vocab_parallel_cross_entropy(cuda_emb.attend(to_fake_cuda(h)), to_fake_cuda(t),
                                                 label_smoothing=0.1)
            except HostSync:
                raise
            except RuntimeError as e:
                assert "device-side assert" in str(e), str(e)
            else:
                raise AssertionError("smoothing over padded columns on CUDA passed without a device-side failure")
    vocab = 12 * world                                             # a shard that is not padded
    emb = VocabParallelEmbedding(vocab, D, seed=5)
    full = emb.full_state_dict()["weight"].to(torch.float64)
    h = h.to(torch.float64)
    t = torch.tensor([[0, vocab - 1, -100], [3, 7, 9]])
    for eps in (0.1, 1.0):
        for reduction in ("mean", "sum", "none"):
            local = F.linear(h, emb.weight.detach().to(torch.float64)).requires_grad_(True)
            got = vocab_parallel_cross_entropy(local, t, label_smoothing=eps, reduction=reduction)
            ref_logits = (h @ full.T).requires_grad_(True)
            want = F.cross_entropy(ref_logits.reshape(-1, vocab), t.reshape(-1), label_smoothing=eps,
                                   reduction=reduction)
            torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
            w = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
            (got.reshape(want.shape) * w).sum().backward()
            (want * w).sum().backward()
            s = slice(emb.vocab_start, emb.vocab_end)
            assert local.grad is not None and ref_logits.grad is not None
            torch.testing.assert_close(local.grad, ref_logits.grad[..., s], rtol=1e-12, atol=1e-12)


def check_repeatable_backward() -> None:
    """A repeated backward (retain_graph) gives the same bits, and gradcheck passes in float64 without a
    non-determinism tolerance: ``vocab_parallel_cross_entropy`` (with and without vocab_size=, smoothed) and
    ``VocabParallelEmbedding.loss`` (tests/torch/test_repeatable_backward.py runs the one-process entries)."""
    emb = VocabParallelEmbedding(13, D, seed=5, pad_to_multiple_of=PAD, dtype=torch.float64)
    h = torch.randn(2, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    t = torch.tensor([[0, 12, -100], [3, 7, 9]])
    # through h, the same on every rank (a rank's own logits perturbed on every rank at once would sum the ranks'
    # derivatives in gradcheck's finite differences)
    calls: list[Callable[[torch.Tensor], torch.Tensor]] = [
        lambda x: vocab_parallel_cross_entropy(emb.attend(x), t, vocab_size=13, label_smoothing=0.1),
        lambda x: vocab_parallel_cross_entropy(emb.attend(x), t, vocab_size=13, label_smoothing=0.1,
                                             reduction="sum"),
        lambda x: vocab_parallel_cross_entropy(emb.attend(x), t, reduction="none"),
        lambda x: emb.loss(x, t, label_smoothing=0.1),
        lambda x: emb.loss(x, t, reduction="none", softcap=3.0, chunk_size=2),
    ]
    for fn in calls:
        x = h.clone().requires_grad_(True)
        loss = fn(x)
        w = torch.randn(loss.shape, dtype=loss.dtype, generator=torch.Generator().manual_seed(9))
        first = torch.autograd.grad((loss * w).sum(), [x, emb.weight], retain_graph=True)
        again = torch.autograd.grad((loss * w).sum(), [x, emb.weight])
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert torch.autograd.gradcheck(fn, (h.clone().requires_grad_(True),))


def check_dtypes() -> None:
    """h of another dtype than the shard: attend and loss raise DtypeError (attend gave torch's raw matmul error);
    load_full_state_dict refuses a table of another dtype (it cast a float64 one) before writing anything."""
    emb = _emb()
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        h = _h().to(dtype)
        for fn in (lambda h=h: emb.attend(h), lambda h=h: emb.loss(h, _targets(5))):
            try:
                fn()
            except DtypeError as e:
                assert f"h {str(dtype).replace('torch.', '')} and weight float32" in str(e), str(e)
            else:
                raise AssertionError(f"h {dtype} against a float32 shard was not refused")
    before = emb.weight.detach().clone()
    full = emb.full_state_dict()["weight"]
    for table in (full.double(), full.double().numpy(), full.half()):
        try:
            emb.load_full_state_dict({"weight": table})
        except StateDictError as e:
            assert "dtype" in str(e) and "expected float32" in str(e), str(e)
        else:
            raise AssertionError(f"a {table.dtype} table was taken by a float32 shard")
        assert torch.equal(emb.weight.detach(), before), "nothing is written when refused"
    emb.load_full_state_dict({"weight": full})                     # its own dtype: taken


def refusal_main(rank: int, world: int) -> CheckResults:
    checks: list[tuple[str, Callable[[], None]]] = []
    for call in CALLS:
        checks.append((f"cpu_{call}", lambda call=call: check_refused_on_cpu(call)))
        checks.append((f"fake_cuda_{call}", lambda call=call: check_refused_on_fake_cuda(call)))
    checks.append(("smoothing_without_vocab_size", check_smoothing_without_vocab_size))
    checks.append(("repeatable_backward", check_repeatable_backward))
    checks.append(("dtypes", check_dtypes))
    return run_checks(checks)
