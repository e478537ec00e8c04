"""``tokenpos memory --input-tables``: the per-layer and hashed n-gram rows, in tables and JSON, and the step size
(--batch x --seq-len) their row-sparse training counts."""

from __future__ import annotations

import json

import pytest

from tokenpos.analysis.memory_input import input_tables
from tokenpos.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_input_tables_print_every_row_and_say_what_they_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--input-tables")
    assert code == 0
    for tab in input_tables():
        assert tab.model in out and f"{tab.rows:,}" in out and f"{tab.params:,}" in out
    assert "16,384 tokens" in out                                  # the default step: 8 x 2048
    assert "Token embedding table" not in out                       # the section alone, not the overview
    text = " ".join(out.split())                                    # the footnote wraps at the terminal width
    assert "one fp32 scale per row" in text and "fp8 MiB" in text and "host: device MiB/step" in text


def test_input_tables_json_follow_the_step_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--input-tables", "--batch", "2", "--seq-len", "64", "--json")
    assert code == 0
    rows = json.loads(out)["input_tables"]
    assert rows == [t.to_dict(128) for t in input_tables()]
    per_layer, hashed = rows[0], rows[2]
    assert per_layer["grad_rows"] == 128 and hashed["grad_rows"] == 128 * 16
    assert hashed["bytes"]["int8"] == hashed["bytes"]["fp8"] < hashed["bytes"]["bf16"]
    host = hashed["storage"]["host"]
    assert host["host_bytes"] == hashed["bytes"] and host["device_bytes"] == 128 * 16 * hashed["shape"][1] * 4


def test_batch_alone_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", "--batch", "2")
    assert code == 2 and "--input-tables" in err


def test_help_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "--help")
    assert code == 0 and "--input-tables" in out
