"""VocabParallelEmbedding and vocab_parallel_cross_entropy at world sizes 4, 2 and 1, against one process.

One spawn per world size runs every check (tests/torch/distributed/rank_checks.py); each check is
reported here as its own test, with the failing rank's traceback. W = 4 runs first and writes the
checkpoint that W = 2 and W = 1 load.
"""

from __future__ import annotations

import pytest

from tests.torch.distributed.harness import CheckResults, report_check, run_worlds

pytestmark = pytest.mark.slow   # spawns gloo process groups

WORLDS = (4, 2, 1)
CHECKS = ["checkpoint", "init_V1003", "init_xavier_pad_V1003", "forward_grad_V1003", "forward_grad_scale_pad_V1003",
          "tied_ce_V1003", "init_V50257", "init_xavier_pad_V50257", "forward_grad_V50257",
          "forward_grad_scale_pad_V50257", "tied_ce_V50257", "init_trunc_normal", "unseeded_init",
          "no_grad_forward", "kernels_off", "bf16_forward", "tied_ce_ignore_smoothing", "tied_ce_sum",
          "tied_ce_none", "all_ignored", "gradcheck_f64", "bad_ids", "bad_targets", "random_shapes"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[CheckResults]]:
    # 4 writes the checkpoint, then 2 and 1 load it
    return run_worlds(tmp_path_factory.mktemp("vocab_parallel"), "tests.torch.distributed.rank_checks:rank_main",
                      WORLDS, "table.safetensors")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("check", CHECKS)
def test_rank_check(results: dict[int, list[CheckResults]], world: int, check: str) -> None:
    report_check(results, world, check, suffixed=True)


def test_every_check_is_reported(results: dict[int, list[CheckResults]]) -> None:
    ran = {k.replace("_written", "").replace("_loaded", "") for k in results[1][0]}
    assert ran == set(CHECKS)


def test_checkpoint_written_at_four_is_the_one_loaded(results: dict[int, list[CheckResults]]) -> None:
    assert "checkpoint_written" in results[4][0] and "checkpoint_loaded" in results[2][0]
    assert "checkpoint_loaded" in results[1][0]
