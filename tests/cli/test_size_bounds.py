"""Every size option of every command is bounded in one place, before any work: a clean ConfigError.

Guard (issue 28, item 8): ``tokenpos plot kerple --seq-len 100000000`` allocated 15 GB before failing.
Every integer size option of every command (discovered from the parser: each option typed
``positive_int``, plus ``extrapolate --multiples``) has a bound in ``tokenpos.cli._ui.SIZE_LIMITS``,
checked by ``tokenpos.cli._ui.check_size`` before the command runs: one over the bound exits 2 with
one line naming the option, the value and the bound, no traceback, and the command's work never
starts (its ``run`` is replaced by one that fails the test).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

import tokenpos.cli as cli
from tokenpos.analysis.extrapolate.plot_bias import plot_fire, plot_kerple
from tokenpos.cli._ui import SIZE_LIMITS, positive_int
from tokenpos.tables.errors import ConfigError

REQUIRED = {"plot": ["fire"]}          # positional arguments a command needs
LIST_SIZES = {("extrapolate", "multiples")}   # comma-separated size lists, parsed by the command


def _size_options() -> set[tuple[str, str]]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    found = set()
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.type is positive_int:
                found.add((command, action.dest))
    return found | LIST_SIZES


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in cli.COMMANDS:
        module = importlib.import_module(f"tokenpos.cli.{name}")

        def refuse(args: Any, _name: str = name) -> int:
            raise AssertionError(f"tokenpos {_name} ran with a size beyond its bound")
        monkeypatch.setattr(module, "run", refuse)


def test_every_size_option_has_a_bound() -> None:
    bounded = {(c, d) for c, limits in SIZE_LIMITS.items() for d in limits}
    assert _size_options() == bounded


CASES = sorted(_size_options())


@pytest.mark.parametrize(("command", "dest"), CASES, ids=[f"{c}--{d}" for c, d in CASES])
def test_an_over_large_size_is_a_clean_config_error(command: str, dest: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    limit = SIZE_LIMITS[command][dest]
    option = "--" + dest.replace("_", "-")
    value = f"1,{limit + 1}" if (command, dest) in LIST_SIZES else str(limit + 1)
    if (command, dest) not in LIST_SIZES:
        _no_work(monkeypatch)        # the bound is checked before the command's run (multiples: while parsing them)
    code = cli.main([command, *REQUIRED.get(command, []), option, value])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip() == f"tokenpos {command}: error: {option} must be <= {limit}, got {limit + 1}"
    assert "Traceback" not in out + err


@pytest.mark.parametrize("kind", ["kerple", "fire"])
def test_the_issue_command_fails_at_once(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plot", kind, "--seq-len", "100000000", "--out", str(tmp_path / "x.png")])
    assert code == 2
    assert "--seq-len must be <= 65536, got 100000000" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("plot", [plot_fire, plot_kerple])
def test_the_plot_functions_bound_their_own_sizes(plot: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="seq_len must be <= 65536, got 100000000"):
        plot(tmp_path / "x.png", seq_len=100_000_000)
    with pytest.raises(ConfigError, match="num_heads must be <= 64"):
        plot(tmp_path / "x.png", num_heads=10_000)
