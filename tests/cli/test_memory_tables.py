"""What a person reads from ``tokenpos memory`` (issue 49): no number broken at 80 or 100 columns, GPT-3 listed
once, every registered positional scheme listed and accepted, no "seed 00x" jargon in any command's help or
in the memory output."""

from __future__ import annotations

import re

import pytest

import tokenpos.cli as cli
from tokenpos.cli import main
from tokenpos.cli._table import Grid, parts, print_grid
from tokenpos.tables.registry import SHORTCUTS

# A number as printed: digits with thousands commas, a decimal part, an exponent, a percent sign.
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]\d+)?%?")

OUTPUTS = [
    [],
    ["--vocab-size", "50257", "--d-model", "768"],
    ["--preset", "gpt3-175b"],
    ["--preset", "llama3-8b", "--tp", "8", "--pad-to-multiple-of", "128"],
    ["--tp", "8", "--logits"],
    ["--vocab-size", "1000000000000", "--d-model", "1000000000", "--max-seq-len", "4000000000", "--untied"],
]


def memory(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    code = main(["memory", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("argv", OUTPUTS, ids=[" ".join(a) or "overview" for a in OUTPUTS])
@pytest.mark.parametrize("columns", [80, 100])
def test_no_number_is_broken(argv: list[str], columns: int, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The numbers of the 400-column output and no others: a number cut across two lines would leave its pieces
    (``2,004`` and ``0`` of ``2,004.0``) instead. (A table split by columns repeats its title and its labels.)"""
    narrow = memory(capsys, monkeypatch, columns, *argv)
    wide = memory(capsys, monkeypatch, 400, *argv)
    assert max(len(line) for line in narrow.splitlines()) <= columns
    assert set(NUMBER.findall(narrow)) == set(NUMBER.findall(wide))


def test_a_table_too_wide_is_split_by_columns_with_its_labels() -> None:
    grid = Grid("sizes", ["model", *(f"column {i}" for i in range(8))])
    grid.add_row("Llama 3 8B", *(f"{10 ** 9 + i:,}" for i in range(8)))
    assert parts(grid.widths(), 400) == [list(range(9))]
    split = parts(grid.widths(), 80)
    assert len(split) == 2 and all(p[0] == 0 for p in split)
    assert sorted(c for p in split for c in p[1:]) == list(range(1, 9))
    from rich.console import Console

    con = Console(width=80, record=True, file=open("/dev/null", "w"))   # noqa: SIM115 - rich keeps the file
    print_grid(con, grid)
    text = con.export_text()
    assert "sizes (continued)" in text and text.count("Llama 3 8B") == 2
    assert all(f"{10 ** 9 + i:,}" in text for i in range(8))


def test_gpt3_is_listed_once(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = memory(capsys, monkeypatch, 200)
    rows = [line for line in out.splitlines() if "GPT-3" in line]
    assert len(rows) == 2                                       # the token table and the all-tables table
    assert all("GPT-3 175B" in line for line in rows)


def test_positional_lists_every_registered_scheme(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["memory"]
    choices = next(a for a in sub._actions if a.dest == "positional").choices
    assert sorted(choices) == sorted(SHORTCUTS) and {"fire", "kerple"} <= set(choices)
    out = memory(capsys, monkeypatch, 200)                       # the overview's scheme table: every one
    table = out[out.index("Positional encoding memory"):]
    for name in SHORTCUTS:
        assert re.search(rf"^\s+{name}\s", table, re.MULTILINE), name


def test_a_fire_model_counts_its_parameters(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = memory(capsys, monkeypatch, 200, "--vocab-size", "1000", "--d-model", "256", "--max-seq-len", "128",
                 "--positional", "fire", "--num-heads", "4")
    assert re.search(r"position \(fire\)\s+1 x 198\s+198\s", out)      # 2 W + 2 + (W + 1) H, W = 32, H = 4
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["memory", "--vocab-size", "1000", "--d-model", "256", "--positional", "kerple"]) == 2
    assert "a kerple model needs num_heads" in capsys.readouterr().err


def test_no_seed_jargon_in_help_or_memory(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    texts = [parser.format_help()]
    sub = next(a for a in parser._actions if a.dest == "command")
    texts += [p.format_help() for p in sub.choices.values()]
    texts += [memory(capsys, monkeypatch, 200, *argv) for argv in OUTPUTS]
    texts.append(memory(capsys, monkeypatch, 200, "--json"))
    for text in texts:                                  # (--seed of extrapolate is an option, not jargon)
        assert not re.search(r"seed[ _]?0\d|seed_position", text, re.IGNORECASE), text[:200]
