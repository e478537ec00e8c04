"""The tokenpos console script, called in-process through its entry point ``tokenpos.cli.main``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tokenpos.cli as cli
from tokenpos.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def registered() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return list(sub.choices)


# ---------------------------------------------------------------------------------------------- help


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name in ("report", "memory", "plot"):
        assert name in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 2 and "usage: tokenpos" in out


@pytest.mark.parametrize("command", registered())
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and f"usage: tokenpos {command}" in out


def test_colleague_commands_registered_when_present() -> None:
    import importlib.util

    names = registered()
    for optional in cli.OPTIONAL_COMMANDS:
        present = importlib.util.find_spec(f"tokenpos.cli.{optional}") is not None
        assert (optional in names) == present


def test_missing_or_broken_optional_module(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = cli.importlib.import_module

    def fake(name: str):
        if name == "tokenpos.cli.bench":
            raise RuntimeError("half-written file")
        if name == "tokenpos.cli.extrapolate":
            raise ModuleNotFoundError("No module named 'tokenpos.cli.extrapolate'", name=name)
        return real(name)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    names = registered()
    assert "extrapolate" not in names and "bench" in names
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "unavailable" in out
    code, _, err = run(capsys, "bench")
    assert code == 2 and "half-written file" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------- memory


def test_memory_gpt2_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--vocab-size", "50257", "--d-model", "768", "--max-seq-len", "1024")
    assert code == 0
    assert "38,597,376" in out and "147.2" in out and "154.4" in out     # params, fp32 MiB, fp32 MB
    assert "bf16" in out and "73.6" in out                                # the fp16/bf16 column
    assert "786,432" in out                                               # the learned position table


def test_memory_preset_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--preset", "gpt2", "--json")
    assert code == 0
    (model,) = json.loads(out)["models"]
    tok = model["tables"][0]
    assert tok["params"] == 38_597_376
    assert tok["mib"]["fp32"] == pytest.approx(147.2373046875)
    assert tok["bytes"]["bf16"] == 77_194_752
    assert model["total"]["share_of_model"] == pytest.approx(39_383_808 / 124_439_808)
    assert model["config"]["tied_output"] is True


def test_memory_overview(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory")
    assert code == 0
    for title in ("Small Model", "GPT-3 175B", "GPT-2 small", "BERT-base", "Llama 2 7B", "Llama 3 8B"):
        assert title in out
    assert "2,470.2" in out                                               # the GPT-3 token table: ~2.4 GB
    assert "GPT-3 Scale" not in out                                       # the same table as GPT-3 175B: once


def test_memory_untied_llama(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--preset", "llama2-7b")
    assert code == 0 and "output projection" in out and "untied" in out and "3.89%" in out


# ---------------------------------------------------------------------------------------------- plot, report


def test_plot_sinusoidal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x.png"
    code, out, _ = run(capsys, "plot", "sinusoidal", "--out", str(target), "--d-model", "64", "--dpi", "60")
    assert code == 0 and str(target) in out
    data = target.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


@pytest.mark.slow  # a whole report
def test_report_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    code, out, _ = run(capsys, "report", "--out", str(out_dir), "--quick", "--no-bench", "--no-progress")
    assert code == 0 and "index.html" in out
    page = (out_dir / "index.html").read_text(encoding="utf-8")
    names = re.findall(r'<img src="data:image/png;base64,[^"]+"[^>]*data-file="([^"]+)"', page)
    assert len(names) >= 3
    assert sorted(names) == sorted(p.name for p in out_dir.glob("*.png"))
    assert "<table" in page and "38,597,376" in page


# ---------------------------------------------------------------------------------------------- errors


BAD = [
    (["memory", "--vocab-size", "-5", "--d-model", "768"], "memory", "--vocab-size"),
    (["memory", "--vocab-size=-5", "--d-model", "768"], "memory", "positive"),
    (["memory", "--vocab-size", "50257", "--d-model", "0"], "memory", "--d-model"),
    (["memory", "--vocab-size", "abc", "--d-model", "8"], "memory", "integer"),
    (["memory", "--preset", "gpt5"], "memory", "invalid choice"),
    (["memory", "--vocab-size", "50257"], "memory", "go together"),
    (["memory", "--preset", "gpt2", "--vocab-size", "5", "--d-model", "8"], "memory", "not both"),
    (["plot", "spiral"], "plot", "invalid choice"),
    (["plot", "sinusoidal", "--out", "x.jpg"], "plot", "must end in one of .png, .svg, .pdf"),
    (["plot", "sinusoidal", "--dpi", "100000"], "plot", "dpi must be <= 600"),
    (["plot", "sinusoidal", "--num-positions", "1000000000", "--d-model", "100000"], "plot", "must be <="),
    (["plot", "alibi", "--num-heads", "100000"], "plot", "--num-heads must be <= 64"),
    (["plot", "t5", "--seq-len", "10000"], "plot", "seq_len must be <= 2048"),
    (["plot", "sinusoidal", "--num-heads", "4"], "plot", "does not apply"),
    (["plot", "rope", "--factor", "-2"], "plot", "--factor"),
    (["plot", "sinusoidal", "--out", ""], "plot", "output path must name a file, got ''"),   # was KIND.png
    (["plot", "similarity", "--head-dim", "9"], "plot", "head_dim must be an even number >= 2"),  # a broadcast error
    (["plot", "similarity", "--head-dim", "1"], "plot", "head_dim must be an even number >= 2"),  # a wrong plot
    (["plot", "rope", "--head-dim", "2"], "plot", "head_dim must be an even number >= 4"),     # "dynamic needs"
    (["plot", "mrope", "--head-dim", "3"], "plot", "head_dim must be an even number >= 2"),
    # checked before any training, so nothing is written (--lr inf failed at the JSON, after the whole run)
    (["extrapolate", "--quick", "--lr", "inf", "--checkpoint-dir", "ck"], "extrapolate",
     "lr must be a finite number > 0, got inf"),
    (["extrapolate", "--quick", "--lr", "-1", "--checkpoint-dir", "ck"], "extrapolate", "lr must be a finite"),
    (["extrapolate", "--quick", "--seed", "-1", "--checkpoint-dir", "ck"], "extrapolate",
     "seeds must be integers in [0, 2**63), got [-1]"),
    (["extrapolate", "--quick", "--seed", str(2**70), "--checkpoint-dir", "ck"], "extrapolate", "seeds must be"),
    (["report", "--quick", "--full"], "report", "not allowed"),
    (["report", "--extrapolation", "/nonexistent/results.json", "--no-progress"], "report", "does not exist"),
    (["frobnicate"], "tokenpos", "invalid choice"),
]


@pytest.mark.parametrize(("argv", "cmd", "text"), BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_bad_arguments_one_line(argv: list[str], cmd: str, text: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    prefix = "tokenpos: error:" if cmd == "tokenpos" else f"tokenpos {cmd}: error:"
    assert lines[0].startswith(prefix) and text in lines[0]
    assert "Traceback" not in err + out
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "ck").exists()


def test_unwritable_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run(capsys, "plot", "alibi", "--out", str(blocker / "x.png"))
    assert code == 2 and err.startswith("tokenpos plot: error:") and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "report", "--out", str(blocker), "--no-progress")
    assert code == 2 and "not a folder" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "report", "--out", str(blocker / "sub"), "--no-progress", "--no-bench")
    assert code == 2 and err.startswith("tokenpos report: error:") and "Traceback" not in err


# ---------------------------------------------------------------------------------------------- outputs


def test_plot_out_never_overwrites_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x.png"
    target.write_bytes(b"my own picture")
    code, _, err = run(capsys, "plot", "sinusoidal", "--out", str(target), "--dpi", "40")
    assert code == 2 and "exists; pass --force to replace it" in err and len(err.strip().splitlines()) == 1
    assert target.read_bytes() == b"my own picture"
    code, out, _ = run(capsys, "plot", "sinusoidal", "--out", str(target), "--dpi", "40", "--force")
    assert code == 0 and target.read_bytes()[:8] == PNG_MAGIC


def test_plot_default_output_is_not_overwritten_either(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t5.png").write_bytes(b"keep")
    code, _, err = run(capsys, "plot", "t5", "--dpi", "40")
    assert code == 2 and "'t5.png' exists" in err and (tmp_path / "t5.png").read_bytes() == b"keep"


def test_plot_creates_missing_folders_as_report_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "a" / "b" / "x.png"
    code, out, err = run(capsys, "plot", "sinusoidal", "--out", str(target), "--d-model", "16", "--dpi", "40")
    assert code == 0 and str(target) in out and err == ""
    assert target.read_bytes()[:8] == PNG_MAGIC


def test_a_failed_plot_leaves_no_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plot", "similarity", "--head-dim", "9", "--out", str(tmp_path / "a" / "b" / "x.png"))
    assert code == 2 and "head_dim must be an even number" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()                                 # made for the output, removed again
    code, _, err = run(capsys, "plot", "sinusoidal", "--out", str(tmp_path / "c" / "x.txt"))
    assert code == 2 and "must end in one of" in err and not (tmp_path / "c").exists()   # checked before any folder


def test_report_interrupted_by_ctrl_c_keeps_the_previous_report(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "rep"
    out_dir.mkdir()
    (out_dir / "index.html").write_text("previous", encoding="utf-8")

    def ctrl_c(ctx: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("tokenpos.analysis.report._figures", ctrl_c)
    code, _, err = run(capsys, "report", "--out", str(out_dir), "--quick", "--no-bench", "--no-progress")
    assert code == 130 and "interrupted" in err
    assert (out_dir / "index.html").read_text(encoding="utf-8") == "previous"


def test_report_bad_extrapolation_file_keeps_the_previous_report(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    out_dir.mkdir()
    (out_dir / "index.html").write_text("previous", encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json", encoding="utf-8")
    code, _, err = run(capsys, "report", "--out", str(out_dir), "--extrapolation", str(bad), "--no-progress")
    assert code == 2 and "cannot read extrapolation results" in err and len(err.strip().splitlines()) == 1
    assert (out_dir / "index.html").read_text(encoding="utf-8") == "previous"
    assert sorted(p.name for p in out_dir.iterdir()) == ["index.html"]


def test_a_memory_error_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("tokenpos.analysis.plots.PLOTS", {"sinusoidal": exhausted})
    code, out, err = run(capsys, "plot", "sinusoidal", "--out", str(tmp_path / "x.png"))
    assert code == 2 and err.strip() == "tokenpos plot: error: out of memory; try smaller sizes"
