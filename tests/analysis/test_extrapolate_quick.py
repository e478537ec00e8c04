"""What ``tokenpos extrapolate`` says about itself: --schemes names the default it trains, --quick says what a
short run can show, and the gate's explanation tells an artefact of short training from a finding."""

from __future__ import annotations

import argparse

import pytest

from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, context_gate, explain


def _parser() -> argparse.ArgumentParser:
    from tokenpos.cli import extrapolate

    root = argparse.ArgumentParser()
    return extrapolate.add_parser(root.add_subparsers())


def _help(parser: argparse.ArgumentParser, flag: str) -> str:
    return next(a.help for a in parser._actions if flag in a.option_strings) or ""


@pytest.mark.parametrize("quick", [False, True])
def test_schemes_help_names_the_schemes_a_run_trains(quick: bool) -> None:
    from tokenpos.analysis.extrapolate.schemes import SCHEMES
    from tokenpos.cli.extrapolate import build_config

    parser = _parser()
    trained = build_config(parser.parse_args(["--quick"] if quick else [])).schemes
    assert f"(default: {','.join(trained)};" in _help(parser, "--schemes")
    assert build_config(parser.parse_args(["--full"])).schemes == SCHEMES          # "--full: all"
    assert "about a minute" not in _help(parser, "--quick") and "measured" in _help(parser, "--quick")


def _doc(nll_at_L: dict[str, float], steps: int) -> dict:
    results = [{"scheme": s, "eval_len": 8, "ppl": 2.0, "tail_nll": v, "ratio": 1.0, "protocol": "sliding"}
               for s, v in nll_at_L.items()]
    doc = {"train_len": 8, "results": results, "config": {"steps": steps},
           "ngram": [{"order": 4, "k": 0.1, "protocol": "sliding", "nll": 2.0, "tokens": 16}]}
    return {**doc, "gate": context_gate(doc)}


def test_a_short_run_where_every_scheme_fails_says_it_is_an_artefact() -> None:
    lines = explain(_doc({"rope": 2.4, "alibi": 2.3}, steps=150), default_steps=1000)
    assert lines[0].startswith(f"'{FAIL_TEXT}': rope, alibi did not beat the 4-gram baseline")
    assert "artefact of the short training" in lines[1] and "150 steps" in lines[1]


def test_a_short_run_with_some_passing_schemes_says_what_it_cannot_show() -> None:
    lines = explain(_doc({"rope": 1.4, "nope": 2.3}, steps=150), default_steps=1000)
    assert "nope did not beat" in lines[0] and "rope" not in lines[0].split(" did not")[0]
    assert "undertrained" in lines[1] and "artefact" not in " ".join(lines)


def test_a_default_run_gets_no_short_run_caveat() -> None:
    assert explain(_doc({"rope": 1.4, "alibi": 1.5}, steps=1000), default_steps=1000) == []
    lines = explain(_doc({"rope": 2.4}, steps=1000), default_steps=1000)
    assert "artefact" not in " ".join(lines) and "train longer" in lines[-1]
    assert explain({"train_len": 8, "results": []}, default_steps=1000) == []
