"""Rank checks of where the layers' collectives run and of label smoothing over padded shards
(``test_collectives_and_padding.py`` starts them at W = 1 and 2).

- The construction's seed collective (and the checkpoint's all-ranks flag) runs on the device of the
  group's backend: a CUDA tensor for NCCL (which refuses CPU tensors), whatever device the table is
  built on (the CPU, meta). The backend query is mocked to "nccl" over the real gloo group, the CUDA
  tensors are fake ones (``tests/torch/fake_cuda.py``) and the collective runs on their CPU data.
- ``vocab_parallel_cross_entropy`` with ``label_smoothing > 0`` over padded shards is
  ``F.cross_entropy`` of the unpadded logits (padding columns never count) with ``vocab_size=``, and
  refused without it (a ConfigError naming vocab_size=); over shards that are not padded, never refused.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from tests.torch.distributed.harness import CheckResults, run_checks
from tests.torch.fake_cuda import cpu_of, fake_cuda
from tokenpos.tables.errors import ConfigError
from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy
from tokenpos.torch.distributed._comm import all_ranks_ok

V, D = 13, 4


def _nccl_collective_devices(build: Any) -> tuple[list[torch.device], Any]:
    """The devices of the tensors ``build()`` all-reduces when the group says it is NCCL (mocked)."""
    seen: list[torch.device] = []
    real = dist.all_reduce

    def recording(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(t.device)
        with _disable_current_modes():
            return real(cpu_of(t), *args, **kwargs)

    with mock.patch.object(dist, "get_backend", return_value="nccl"), \
            mock.patch.object(torch.cuda, "current_device", return_value=0), \
            mock.patch.object(dist, "all_reduce", recording), fake_cuda():
        out = build()
    return seen, out


def check_seed_collective_on_the_backend_device(device: str) -> None:
    world = dist.get_world_size()
    torch.manual_seed(11 + dist.get_rank())                 # different generators: rank 0's draw must win
    seen, emb = _nccl_collective_devices(lambda: VocabParallelEmbedding(V, D, device=device))
    assert seen == ([torch.device("cuda", 0)] if world > 1 else []), seen
    if device == "cpu":                                     # one table: the shards of rank 0's seed, on every rank
        full = emb.full_state_dict()["weight"]
        gathered = [torch.empty_like(full) for _ in range(world)]
        dist.all_gather(gathered, full)
        assert all(torch.equal(g, gathered[0]) for g in gathered)


def check_all_ranks_flag_on_the_backend_device() -> None:
    world = dist.get_world_size()
    seen, ok = _nccl_collective_devices(lambda: all_ranks_ok(dist.get_rank() != 1, dist.group.WORLD, world))
    assert seen == ([torch.device("cuda", 0)] if world > 1 else []), seen
    assert ok is (world == 1)


def _padded_logits(full: torch.Tensor, world: int, rank: int, per: int) -> torch.Tensor:
    """This rank's columns of ``full`` (..., V) padded with -inf to world * per columns (as ``attend``)."""
    padded = F.pad(full, (0, per * world - full.shape[-1]), value=float("-inf"))
    return padded[..., rank * per: (rank + 1) * per]


def check_smoothing_over_padded_shards() -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    per = 16 // world                                       # V = 13 padded to 16 columns: 3 of them padding
    full = torch.randn(3, 4, V, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([[0, 12, -100, 5], [7, 7, 1, 2], [-100, 3, 11, 0]])
    local = _padded_logits(full, world, rank, per).requires_grad_(True)
    for eps in (0.1, 0.5, 1.0):
        for reduction in ("mean", "sum", "none"):
            want = F.cross_entropy(full.reshape(-1, V), targets.reshape(-1), label_smoothing=eps, reduction=reduction)
            got = vocab_parallel_cross_entropy(local, targets, vocab_size=V, label_smoothing=eps, reduction=reduction)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    emb = VocabParallelEmbedding(V, D, seed=0, pad_to_multiple_of=8)       # attend's padding columns, the same
    h = torch.randn(3, D, generator=torch.Generator().manual_seed(4))
    loss = vocab_parallel_cross_entropy(emb.attend(h), torch.tensor([0, 12, 4]), vocab_size=V, label_smoothing=0.2)
    full_w = emb.full_state_dict()["weight"]
    torch.testing.assert_close(loss, F.cross_entropy(h @ full_w.T, torch.tensor([0, 12, 4]), label_smoothing=0.2),
                               rtol=1e-6, atol=1e-6)


def check_smoothing_without_vocab_size() -> None:
    """Without vocab_size= label smoothing over padded (-inf) columns is refused on every rank with the ConfigError
    naming vocab_size= (API.md: never an infinite loss), and over shards that are not padded never refused (issue
    48 item 5); without smoothing the padding adds exp(-inf) = 0."""
    world, rank = dist.get_world_size(), dist.get_rank()
    full = torch.randn(2, V, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    local = _padded_logits(full, world, rank, 16 // world)
    with pytest.raises(ConfigError, match="vocab_size="):
        vocab_parallel_cross_entropy(local, torch.tensor([1, 2]), label_smoothing=0.1)
    even = torch.randn(2, 4 * world, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    loss = vocab_parallel_cross_entropy(even[:, 4 * rank:4 * rank + 4], torch.tensor([1, 2]), label_smoothing=0.1)
    torch.testing.assert_close(loss, F.cross_entropy(even, torch.tensor([1, 2]), label_smoothing=0.1),
                               rtol=1e-12, atol=1e-12)
    loss = vocab_parallel_cross_entropy(local, torch.tensor([1, 2]))       # no smoothing: padding adds exp(-inf) = 0
    torch.testing.assert_close(loss, F.cross_entropy(full, torch.tensor([1, 2])), rtol=1e-12, atol=1e-12)


def collective_main(rank: int, world: int) -> CheckResults:
    return run_checks([
        ("seed_collective_cpu", lambda: check_seed_collective_on_the_backend_device("cpu")),
        ("seed_collective_meta", lambda: check_seed_collective_on_the_backend_device("meta")),
        ("all_ranks_flag", check_all_ranks_flag_on_the_backend_device),
        ("smoothing_padded", check_smoothing_over_padded_shards),
        ("smoothing_without_vocab_size", check_smoothing_without_vocab_size),
    ])
