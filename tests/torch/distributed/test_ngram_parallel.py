"""VocabParallelHashedNgramEmbedding at world sizes 2, 3 and 1, against the one-process HashedNgramEmbedding.

One spawn per world size runs every check (tests/torch/distributed/ngram_checks.py); each check is reported here as
its own test, with the failing rank's traceback. W = 2 runs first and writes the checkpoint that W = 3 and W = 1
load (resharding 2 -> 3 and 2 -> 1).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.torch.distributed.harness import CheckResults, report_check, run_worlds
from tests.torch.distributed.ngram_checks import settings
from tokenpos.tables.errors import ConfigError
from tokenpos.torch.distributed import VocabParallelHashedNgramEmbedding

pytestmark = pytest.mark.slow   # spawns gloo process groups

WORLDS = (2, 3, 1)
CHECKS = ["checkpoint", "layout_even", "layout_odd", "init_standard_normal", "init_normal", "init_xavier",
          "init_trunc_normal", "init_rng", "unseeded_init"] + [
    f"{name}_n{n}_h{h}" for n, h in ((2, 1), (3, 2), (4, 3))
    for name in ("forward_grad", "forward_grad_f64", "packed_context", "packed", "decode_context")] + [
    "layer_15", "packed_equals_documents", "decode_steps", "no_grad_and_lists", "kernels_off", "bf16_forward",
    "sparse_grad_f32", "sparse_grad_f64", "bad_inputs", "bad_ids_on_one_rank", "fake_cuda", "random_shapes"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[CheckResults]]:
    # 2 writes the checkpoint, then 3 and 1 load it
    return run_worlds(tmp_path_factory.mktemp("ngram_parallel"), "tests.torch.distributed.ngram_checks:ngram_main",
                      WORLDS, "ngram.safetensors")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("check", CHECKS)
def test_rank_check(results: dict[int, list[CheckResults]], world: int, check: str) -> None:
    report_check(results, world, check, suffixed=True, skips=True)   # skips: fake CUDA where Triton is absent


def test_every_check_is_reported(results: dict[int, list[CheckResults]]) -> None:
    ran = {k.replace("_written", "").replace("_loaded", "") for k in results[1][0]}
    assert ran == set(CHECKS)


def test_checkpoint_written_at_two_is_the_one_loaded(results: dict[int, list[CheckResults]]) -> None:
    assert "checkpoint_written" in results[2][0] and "checkpoint_loaded" in results[3][0]
    assert "checkpoint_loaded" in results[1][0]


def test_without_a_process_group_the_error_says_what_to_do() -> None:
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="init_process_group"):
        VocabParallelHashedNgramEmbedding(**settings(), init_seed=0)
