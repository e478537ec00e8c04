"""The HF Trainer example (``python -m tokenpos.examples.hf_trainer``): patched (``loss=True``) and unpatched
fine-tuning with gradient accumulation over packed batches give the same loss curve and weights."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")                    # the Trainer's own dependency

from tokenpos.examples import hf_trainer  # noqa: E402


@pytest.mark.slow
def test_patched_and_unpatched_trainer_runs_are_equal(capsys: pytest.CaptureFixture[str]) -> None:
    r = hf_trainer.compare(steps=2)
    assert len(r["hf"]) == len(r["tokenpos"]) == 4                 # 2 steps x 2 accumulated micro-batches
    assert r["hf"][0] != r["hf"][2]                                 # training moved the model
    assert r["loss_rel"] <= hf_trainer.LOSS_RTOL
    assert r["weight_rel"] <= hf_trainer.WEIGHT_RTOL
    assert hf_trainer.main(["--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "equal" in out and "DIFFERENT" not in out
