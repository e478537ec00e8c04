"""Every value the vocab-parallel losses refuse, tried on the CPU and fake CUDA at W = 1, 2 and 3, and label
smoothing without ``vocab_size=``, repeatable backwards, and h / tables of two dtypes (``refusal_checks.py``; issue
48, items 1, 3, 5 and 9)."""

from __future__ import annotations

import pytest

from tests.torch.distributed.harness import CheckResults, report_check, run_world
from tests.torch.distributed.refusal_checks import CALLS

pytestmark = pytest.mark.slow   # spawns gloo process groups

WORLDS = (1, 2, 3)
CHECKS = ([f"cpu_{c}" for c in CALLS] + [f"fake_cuda_{c}" for c in CALLS]
          + ["smoothing_without_vocab_size", "repeatable_backward", "dtypes"])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[CheckResults]]:
    tmp = tmp_path_factory.mktemp("refusals")
    return {world: run_world(world, "tests.torch.distributed.refusal_checks:refusal_main", tmp) for world in WORLDS}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("check", CHECKS)
def test_refusal_check(results: dict[int, list[CheckResults]], world: int, check: str) -> None:
    report_check(results, world, check, skips=True)


def test_every_check_is_reported(results: dict[int, list[CheckResults]]) -> None:
    for world in WORLDS:
        for res in results[world]:
            assert sorted(res) == sorted(CHECKS)
