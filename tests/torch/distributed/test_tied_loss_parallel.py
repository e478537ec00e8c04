"""VocabParallelEmbedding.loss at world sizes 4, 2 and 1 against one process (tied_loss_checks.py, one spawn per
world size, each check reported as its own test with the failing rank's traceback)."""

from __future__ import annotations

import pytest

from tests.torch.distributed.harness import CheckResults, run_world

pytestmark = pytest.mark.slow   # spawns gloo process groups

WORLDS = (4, 2, 1)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[CheckResults]]:
    tmp = tmp_path_factory.mktemp("tied_loss")
    return {world: run_world(world, "tests.torch.distributed.tied_loss_checks:rank_main", tmp) for world in WORLDS}


@pytest.mark.parametrize("world", WORLDS)
def test_every_check_passes_on_every_rank(results: dict[int, list[CheckResults]], world: int) -> None:
    assert len(results[world]) == world
    failed = {f"{name} (rank {rank})": tb for rank, res in enumerate(results[world]) for name, tb in res.items() if tb}
    assert not failed, "\n".join(f"{k}:\n{v}" for k, v in failed.items())
    assert len(results[world][0]) == 4 * 4 + 3
