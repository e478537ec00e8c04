"""The study's write-up, generated from its JSON document: the results part of docs/EXTRAPOLATION.md and the
README section. Each lives between ``<!-- extrapolate:NAME:begin -->`` and ``<!-- extrapolate:NAME:end -->``
markers; ``update_docs`` rewrites them, and a test regenerates both from docs/extrapolation_full.json, so every
number in them recomputes from the JSON.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tokenpos.analysis.extrapolate.document import load_json
from tokenpos.analysis.extrapolate.gate import FAIL_TEXT
from tokenpos.analysis.extrapolate.render import _markdown, comparison_table, curve_table, table, task_table
from tokenpos.tables.errors import ConfigError


def _ci(x: float, ci: list[float] | None, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if ci is None else f"{x:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def _seeds(config: dict[str, Any]) -> list[int]:
    """The language models' seeds of a plain study config (``seeds``, else the one ``seed``)."""
    return list(config["seeds"] or [config["seed"]])


def _spread(seconds: list[float]) -> str:
    """Summed, median and range of a list of wall times in seconds."""
    xs = sorted(seconds)
    return f"{sum(xs):.0f} s summed, median {xs[len(xs) // 2]:.0f} s, range {xs[0]:.0f}-{xs[-1]:.0f} s"


def _run_facts(doc: dict[str, Any]) -> list[str]:
    c = doc["config"]
    seeds = _seeds(c)
    task = c.get("task")
    command = doc.get("command")
    lines = [f"- Command: `{'not recorded' if command is None else command}`",
             f"- Wall time of the command {doc['seconds']:.0f} s on {doc['threads']} thread(s) of a shared 2-core "
             f"machine (units already checkpointed are loaded, not rerun); training time of the "
             f"{len(doc['runs'])} models as each unit recorded it: {_spread([r['train_seconds'] for r in doc['runs']])}"
             + ("" if doc.get("complete", True) else " (partial run: not every unit finished)") + ".",
             f"- Model: {c['num_layers']} layers, d_model {c['d_model']}, {c['num_heads']} heads, trained at "
             f"L = {doc['train_len']} for {c['steps']} steps of batch {c['batch_size']} (lr {c['lr']:g}); seeds "
             f"{', '.join(str(s) for s in seeds)}; schemes {', '.join(c['schemes'])}.",
             f"- Corpus {doc['corpus']}: {doc['train_chars']} train / {doc['eval_chars']} eval characters, "
             f"V = {doc['vocab_size']}; sliding window: stride {c['sliding_stride'] or doc['train_len'] // 4}, "
             f"{c['sliding_tokens']} scored tokens; tail protocol: {doc['eval_tokens_per_length']} tokens in "
             f"blocks of {max(r['eval_len'] for r in doc['results'])}, the last {doc['train_len'] // 2} "
             f"positions scored."]
    if task:
        lines.append(f"- Tasks {', '.join(task['tasks'])}: trained at length {task['train_len']} until "
                     f"{task['target_accuracy']:.0%} per-token accuracy there or {task['steps']} steps, "
                     f"{task['eval_examples']} eval examples per length, seeds "
                     f"{', '.join(str(s) for s in (c['task_seeds'] or seeds))}.")
    return lines


def _gate_table(doc: dict[str, Any]) -> str:
    gate = doc["gate"]
    rows = [[f"{g['order']}-gram (add-k {g['k']:g})", f"{g['nll']:.4f}", "-"]
            for g in doc.get("ngram", []) if g["protocol"] == gate["protocol"]]
    by = {(r["scheme"], r["eval_len"]): r for r in doc["results"] if r.get("protocol") == gate["protocol"]}
    for name, e in gate["schemes"].items():
        r = by[name, doc["train_len"]]
        nll = "n/a" if e["nll_at_L"] is None else _ci(e["nll_at_L"], r.get("tail_nll_ci"))
        rows.append([name, nll, "yes" if e["passes"] else f"no: {FAIL_TEXT}"])
    return _markdown(["model", f"NLL at L = {doc['train_len']} ({gate['protocol']})", "beats the 4-gram"], rows)


def _headline(doc: dict[str, Any]) -> str:
    gate = doc["gate"]
    passing = [s for s, e in gate["schemes"].items() if e["passes"]]
    if not passing:
        return (f"No scheme beats the 4-gram in distribution, so no scheme has extrapolation numbers here: "
                f"every R(k) below reads \"{FAIL_TEXT}\".")
    headers, rows = table(doc, gate["protocol"])
    return _markdown(headers, [r for r in rows if r[0] in passing])


def _findings(doc: dict[str, Any]) -> list[str]:
    block = doc["comparisons"]
    out = []
    for e in block["entries"]:
        numbers = "" if e["difference"] is None else \
            (f": {e['metric']} difference {_ci(e['difference'], e['ci'])}, p {e['p']:.4f}, Holm p "
             f"{e['p_holm']:.4f}" if e["p_holm"] is not None else f": {e['metric']} difference {e['difference']:.4f}")
        reason = f" ({e['reason']})" if e["reason"] else ""
        out.append(f"- {e['a']} vs {e['b']}. Paper: {e['claim']} ({e['source']}). Here: **{e['verdict']}**"
                   f"{reason}{numbers}.")
    return out


def results_block(doc: dict[str, Any]) -> str:
    """The results part of docs/EXTRAPOLATION.md, from the study's document."""
    parts = ["### What ran", "", *_run_facts(doc), "",
             f"### The context gate ({doc['gate']['rule']})", "", _gate_table(doc), "",
             "### Headline table (schemes that pass the gate; mean [95% t-interval over seeds])", "",
             _headline(doc), ""]
    for protocol in ("sliding", "nonoverlap"):
        if any(r.get("protocol") == protocol for r in doc["results"]):
            parts += [f"### Every scheme, {protocol} protocol", "", _markdown(*table(doc, protocol)), ""]
    if doc.get("curves"):
        parts += ["### NLL by position at the longest length (tail protocol's windows, mean [95% interval])", "",
                  _markdown(*curve_table(doc)), ""]
    block = doc["comparisons"]
    parts += [f"### Pre-registered comparisons ({block['test']}, {block['correction']}-adjusted over the tested "
              f"ones, alpha {block['alpha']}, smallest difference that counts {block['smallest_difference']})", "",
              _markdown(*comparison_table(doc)), "", "### Findings beside the papers", "", *_findings(doc), ""]
    for task in sorted({e["task"] for e in doc.get("task_results", [])}):
        parts += [f"### Task {task}: per-token / exact-match accuracy (%) by input length", "",
                  _markdown(*task_table(doc, task)), ""]
    return "\n".join(parts).rstrip() + "\n"


def _task_summary(doc: dict[str, Any]) -> list[str]:
    """One line per task: in how many (scheme, seed) runs the model reached the target in distribution."""
    out = []
    for task in sorted({e["task"] for e in doc.get("task_results", [])}):
        runs = {(r["scheme"], r["seed"]): r["trained"] for r in doc.get("task_seed_results", [])
                if r["task"] == task}
        rest = "" if all(runs.values()) else " (the rest make no claim)"
        out.append(f"- Task {task}: {sum(runs.values())} of {len(runs)} (scheme, seed) models reached the "
                   f"per-token target in distribution{rest}.")
    return out


def readme_block(doc: dict[str, Any]) -> str:
    """The README section's text, from the study's document: the gate, every pre-registered finding beside
    its paper, the tasks' training."""
    gate = doc["gate"]
    passing = [s for s, e in gate["schemes"].items() if e["passes"]]
    nlls = ", ".join(f"{s} {e['nll_at_L']:.4f}" for s, e in gate["schemes"].items() if e["nll_at_L"] is not None)
    return "\n".join([
        f"`tokenpos extrapolate` trains one tiny character LM per positional scheme at L = {doc['train_len']} and "
        f"scores the same target tokens at 1-{max(r['eval_len'] for r in doc['results']) // doc['train_len']}L "
        f"beside add-k n-gram baselines. The checked-in run (docs/extrapolation_full.json: "
        f"{len(_seeds(doc['config']))} seeds, {len(doc['runs'])} language models, training time "
        f"{_spread([r['train_seconds'] for r in doc['runs']])}; command in the JSON):",
        "",
        f"- 4-gram NLL at L: {gate['baseline_nll']:.4f}; schemes that beat it: "
        f"{', '.join(passing) if passing else 'none'}; NLL at L: {nlls}.",
        *_task_summary(doc),
        "",
        f"Pre-registered comparisons ({doc['comparisons']['correction']}-corrected; a verdict needs Holm p < "
        f"{doc['comparisons']['alpha']} and a difference of at least {doc['comparisons']['smallest_difference']}):",
        "",
        *_findings(doc),
        "",
        "Everything, with intervals, the per-position curves, the passkey probe and the tasks, is in "
        "docs/EXTRAPOLATION.md, generated from the JSON.",
    ]) + "\n"


def budget_block(doc: dict[str, Any], budget: dict[str, Any]) -> str:
    """The budget check beside the study: the context gate of a run with fewer training steps (``budget``)
    next to the study's own (``doc``), scheme by scheme, and what one model of each costs to train."""
    gate, cheap = doc["gate"], budget["gate"]
    seconds = [r["train_seconds"] for r in budget["runs"]]
    c, b = doc["config"], budget["config"]

    def cell(g: dict[str, Any] | None) -> list[str]:
        if g is None or g["nll_at_L"] is None:
            return ["n/a", "-"]
        return [f"{g['nll_at_L']:.4f}", "yes" if g["passes"] else "no"]

    rows = [[name, *cell(e), *cell(gate["schemes"].get(name))] for name, e in cheap["schemes"].items()]
    seeds = ", ".join(str(s) for s in _seeds(b))
    command = budget.get("command")
    lines = [f"- Command: `{'not recorded' if command is None else command}`",
             f"- The study's model and data with {b['steps']} training steps instead of {c['steps']}, seed(s) "
             f"{seeds}; the same 4-gram ({cheap['baseline_nll']:.4f} on the same scored tokens).",
             f"- Training time of the {len(seconds)} models in this run (one thread each of a shared 2-core "
             f"machine): {_spread(seconds)}.",
             "",
             _markdown(["scheme", f"NLL at L, {b['steps']} steps", "beats the 4-gram",
                        f"NLL at L, {c['steps']} steps (the study, mean of {len(_seeds(c))} seeds)",
                        "beats the 4-gram"], rows)]
    return "\n".join(lines) + "\n"


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- extrapolate:{name}:begin -->\n", f"<!-- extrapolate:{name}:end -->"


def block_text(text: str, name: str) -> str:
    """The text between ``name``'s markers.

    Raises:
        ConfigError: the markers are missing.
    """
    begin, end = _markers(name)
    m = re.search(re.escape(begin) + r"(.*?)" + re.escape(end), text, flags=re.S)
    if m is None:
        raise ConfigError(f"no '{begin.strip()}' ... '{end}' block; expected one")
    return m.group(1)


def replaced(text: str, name: str, content: str) -> str:
    """``text`` with ``name``'s block replaced by ``content``."""
    old = block_text(text, name)
    begin, end = _markers(name)
    return text.replace(begin + old + end, begin + content + end)


def update_docs(json_path: str | Path, extrapolation_md: str | Path, readme: str | Path,
                budget_path: str | Path | None = None) -> None:
    """Rewrite the generated blocks of both documents from the JSON at ``json_path`` (and the budget block of
    docs/EXTRAPOLATION.md from the budget run's JSON at ``budget_path``, when given)."""
    from tokenpos._files import atomic_write_text

    doc = load_json(json_path)
    md_blocks = {"results": results_block(doc)}
    if budget_path is not None:
        md_blocks["budget"] = budget_block(doc, load_json(budget_path))
    for path, blocks in ((extrapolation_md, md_blocks), (readme, {"readme": readme_block(doc)})):
        text = Path(path).read_text(encoding="utf-8")        # each document read and written once
        for name, content in blocks.items():
            text = replaced(text, name, content)
        atomic_write_text(path, text)
