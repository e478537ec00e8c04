"""Every number of the study in README.md and docs/EXTRAPOLATION.md recomputes from docs/extrapolation_full.json:
the generated blocks equal their regeneration, and the hand-written text around them holds no measured number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenpos.analysis.extrapolate.document import load_json
from tokenpos.analysis.extrapolate.writeup import block_text, budget_block, readme_block, replaced, results_block
from tokenpos.tables.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs" / "extrapolation_full.json"
BUDGET = ROOT / "docs" / "extrapolation_budget.json"


def test_generated_blocks_recompute_from_the_json():
    doc = load_json(STUDY)
    assert block_text((ROOT / "docs" / "EXTRAPOLATION.md").read_text(encoding="utf-8"), "results") == \
        results_block(doc)
    assert block_text((ROOT / "README.md").read_text(encoding="utf-8"), "readme") == readme_block(doc)
    assert block_text((ROOT / "docs" / "EXTRAPOLATION.md").read_text(encoding="utf-8"), "budget") == \
        budget_block(doc, load_json(BUDGET))


def _settings(value):
    """Every number among a JSON value's leaves."""
    if isinstance(value, dict):
        return {x for v in value.values() for x in _settings(v)}
    if isinstance(value, list):
        return {x for v in value for x in _settings(v)}
    return {float(value)} if isinstance(value, (int, float)) and not isinstance(value, bool) else set()


def test_no_measured_number_outside_the_generated_blocks():
    """Measurements print with two or more decimals; outside the generated blocks the hand-written text may hold
    only settings that the JSON records (the alpha, the smallest difference), never a measurement."""
    doc = load_json(STUDY)
    settings = _settings(doc["config"]) | _settings({k: v for k, v in doc["comparisons"].items() if k != "entries"})
    text = (ROOT / "docs" / "EXTRAPOLATION.md").read_text(encoding="utf-8")
    outside = text.replace(block_text(text, "results"), "").replace(block_text(text, "budget"), "")
    assert [x for x in re.findall(r"\d+\.\d\d+", outside) if float(x) not in settings] == []


def test_the_json_holds_what_the_write_up_needs():
    doc = load_json(STUDY)
    assert {g["order"] for g in doc["ngram"]} == {2, 3, 4}
    assert doc["command"].startswith("tokenpos extrapolate --config ")
    assert len(doc["comparisons"]["entries"]) >= 5 and doc["comparisons"]["correction"] == "Holm"
    assert {e["task"] for e in doc["task_results"]} >= {"passkey"}
    passing = [s for s, e in doc["gate"]["schemes"].items() if e["passes"]]
    headline = results_block(doc).split("### Headline table")[1].split("###")[0]
    for scheme in doc["gate"]["schemes"]:                      # the headline holds only schemes above the 4-gram
        assert (f"\n| {scheme} |" in headline) == (scheme in passing)


def test_block_markers():
    text = "a\n<!-- extrapolate:x:begin -->\nold\n<!-- extrapolate:x:end -->\nb"
    assert block_text(text, "x") == "old\n"
    assert replaced(text, "x", "new\n") == "a\n<!-- extrapolate:x:begin -->\nnew\n<!-- extrapolate:x:end -->\nb"
    with pytest.raises(ConfigError, match="no '<!-- extrapolate:y:begin -->'"):
        block_text(text, "y")


def test_budget_block_sets_the_cheaper_run_beside_the_study():
    import copy

    doc = load_json(STUDY)
    budget = copy.deepcopy(doc)
    budget["config"]["steps"] = 7
    first = next(iter(budget["gate"]["schemes"]))
    budget["gate"]["schemes"][first] = {"nll_at_L": 1.25, "passes": True}
    text = budget_block(doc, budget)
    assert f"with 7 training steps instead of {doc['config']['steps']}" in text
    full = doc["gate"]["schemes"][first]
    assert f"| {first} | 1.2500 | yes | {full['nll_at_L']:.4f} | {'yes' if full['passes'] else 'no'} |" in text
    assert f"Training time of the {len(doc['runs'])} models in this run" in text


def test_update_docs_rewrites_every_stale_block_from_the_json(tmp_path):
    from tokenpos.analysis.extrapolate.writeup import update_docs

    originals = {name: (ROOT / rel).read_text(encoding="utf-8")
                 for name, rel in (("md", "docs/EXTRAPOLATION.md"), ("readme", "README.md"))}
    md, readme = tmp_path / "EXTRAPOLATION.md", tmp_path / "README.md"
    md.write_text(replaced(replaced(originals["md"], "results", "stale\n"), "budget", "stale\n"), encoding="utf-8")
    readme.write_text(replaced(originals["readme"], "readme", "stale\n"), encoding="utf-8")
    update_docs(STUDY, md, readme, BUDGET)
    assert md.read_text(encoding="utf-8") == originals["md"]
    assert readme.read_text(encoding="utf-8") == originals["readme"]
