"""Where the vocab-parallel layer's own collectives run (the group backend's device), and label
smoothing over padded shards, at W = 1 and 2 (``collective_checks.py``)."""

from __future__ import annotations

import pytest

from tests.torch.distributed.harness import CheckResults, report_check, run_world

pytestmark = pytest.mark.slow   # spawns gloo process groups

WORLDS = (1, 2)
CHECKS = ["seed_collective_cpu", "seed_collective_meta", "all_ranks_flag", "smoothing_padded",
          "smoothing_without_vocab_size"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[CheckResults]]:
    tmp = tmp_path_factory.mktemp("collectives")
    return {world: run_world(world, "tests.torch.distributed.collective_checks:collective_main", tmp)
            for world in WORLDS}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("check", CHECKS)
def test_collective_check(results: dict[int, list[CheckResults]], world: int, check: str) -> None:
    report_check(results, world, check)


def test_every_check_is_reported(results: dict[int, list[CheckResults]]) -> None:
    for world in WORLDS:
        for res in results[world]:
            assert sorted(res) == sorted(CHECKS)
