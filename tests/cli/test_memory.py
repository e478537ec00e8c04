"""``tokenpos memory``: the vocab-parallel split (--tp) and the contracts of its output and its inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenpos.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------- --tp


def test_tp8_megatron_padding_of_gpt2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--tp", "8", "--preset", "gpt2", "--pad-to-multiple-of", "128")
    assert code == 0
    assert "vocab 50,257 padded to 51,200" in out and "943 padding rows" in out and "6,400 rows per rank" in out


def test_tp1_pad64_of_gpt2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--tp", "1", "--preset", "gpt2", "--pad-to-multiple-of", "64")
    assert code == 0 and "vocab 50,257 padded to 50,304" in out


def test_tp_json_per_rank_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--tp", "8", "--preset", "llama3-8b", "--batch", "2", "--seq-len", "4096",
                       "--json")
    assert code == 0
    (v,) = json.loads(out)["vocab_parallel"]
    assert v["padded_vocab"] == 128256 and v["shard_rows"] == 16032 and v["padding_rows"] == 0
    assert v["shard_params_per_rank"] == 2 * 16032 * 4096                       # untied: two sharded tables
    assert v["adam_bytes_per_rank"] == 16 * 2 * 16032 * 4096
    assert v["logits_per_rank"] == 2 * 4096 * 16032


def test_tp_alone_covers_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--tp", "4")
    assert code == 0
    for title in ("GPT-2 small", "GPT-3 175B", "BERT-base", "Llama 2 7B", "Llama 3 8B"):
        assert title in out
    assert "vocab 50,257 padded to 50,260" in out                              # multiple of 1 x 4


def test_tp_options_need_tp(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", "--preset", "gpt2", "--pad-to-multiple-of", "64")
    assert code == 2 and "only apply with --tp" in err


# ---------------------------------------------------------------------------------------------- inputs


def test_learned_without_max_seq_len_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", "--vocab-size", "50257", "--d-model", "768", "--positional", "learned")
    assert code == 2 and "--max-seq-len" in err


def test_default_positional_without_length_says_the_table_is_not_counted(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--vocab-size", "50257", "--d-model", "768")
    assert code == 0 and "no learned position table counted" in out


def test_t5_needs_its_head_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", "--vocab-size", "32128", "--d-model", "512", "--positional", "t5")
    assert code == 2 and "num_heads" in err
    code, out, _ = run(capsys, "memory", "--vocab-size", "32128", "--d-model", "512", "--positional", "t5",
                       "--num-heads", "8")
    assert code == 0 and "32 x 8" in out


def test_total_smaller_than_the_embedding_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "memory", "--vocab-size", "50257", "--d-model", "768", "--total-params", "1")
    assert code == 2 and "smaller than the embedding tables" in err and "%" not in out


def test_huge_sizes_print_in_scientific_notation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--vocab-size", str(2 ** 40), "--d-model", str(2 ** 30))   # the bounds
    assert code == 0
    assert "4.504e+15" in out                                                  # 2**72 fp32 bytes / 2**20
    assert "4,503,599,627,370,496" not in out                                  # never the float's digits


class _ClosedPipe:
    """A stdout whose reader has gone away: every write raises BrokenPipeError."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("argv", [["memory"], ["memory", "--json"], ["memory", "--tp", "2"]])
def test_closed_pipe_ends_quietly(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                  argv: list[str]) -> None:
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = main(argv)
    monkeypatch.undo()
    assert code == 141 and capsys.readouterr().err == ""


def test_head_closes_the_pipe_quietly() -> None:
    """``tokenpos memory | head -0``: the reader is gone before the first write; nothing on stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    code = "import sys; from tokenpos.cli import main; sys.exit(main(['memory']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()                                                        # before the child has printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


# ---------------------------------------------------------------------------------------------- --logits


def test_logits_of_gpt2_at_the_issues_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33: GPT-2's fp32 logits at B=16, L=512 are 1.6 GB, their gradient as much again; the fused loss
    holds one 64 MiB block."""
    code, out, _ = run(capsys, "memory", "--logits", "--preset", "gpt2", "--batch", "16", "--seq-len", "512",
                       "--json")
    assert code == 0
    (r,) = json.loads(out)["logits"]
    n = 16 * 512
    assert r["tokens"] == n and r["logits_bytes"] == n * 50257 * 4 and r["materialised_bytes"] == 2 * n * 50257 * 4
    assert round(r["logits_bytes"] / 1e9, 1) == 1.6
    assert r["chunk_tokens"] == (64 << 20) // (4 * 50257)
    assert r["fused_bytes"] == (r["chunk_tokens"] * 50257 + n) * 4 <= (64 << 20) + 4 * n
    assert r["saved_bytes"] == r["materialised_bytes"] - r["fused_bytes"]


def test_logits_alone_covers_every_preset_and_bf16_halves_them(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenpos.analysis.memory import PRESETS

    code, out, _ = run(capsys, "memory", "--logits", "--batch", "4", "--seq-len", "8192")
    assert code == 0 and "Logits and the fused tied loss" in out
    for c in PRESETS.values():
        assert (c.title or c.name) in out
    code, out, _ = run(capsys, "memory", "--logits", "--batch", "4", "--seq-len", "8192", "--json")
    fp32 = {r["model"]: r for r in json.loads(out)["logits"]}
    assert fp32["llama3-8b"]["logits_bytes"] == 4 * 8192 * 128256 * 4        # 16.8 GB, the issue's number
    code, out, _ = run(capsys, "memory", "--logits", "--batch", "4", "--seq-len", "8192", "--json",
                       "--logits-dtype", "bf16")
    for r in json.loads(out)["logits"]:
        assert r["dtype"] == "bf16" and 2 * r["logits_bytes"] == fp32[r["model"]]["logits_bytes"]
        assert r["fused_bytes"] == fp32[r["model"]]["fused_bytes"]             # the blocks are fp32 either way


def test_logits_options_need_their_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", "--preset", "gpt2", "--batch", "4")
    assert code == 2 and "--tp N" in err and "--logits" in err
    code, _, err = run(capsys, "memory", "--preset", "gpt2", "--logits-dtype", "bf16")
    assert code == 2 and "--logits-dtype only applies with --logits" in err
    code, out, _ = run(capsys, "memory", "--logits", "--tp", "2", "--preset", "gpt2", "--batch", "2", "--json")
    got = json.loads(out)
    assert got["logits"][0]["batch"] == got["vocab_parallel"][0]["batch"] == 2
