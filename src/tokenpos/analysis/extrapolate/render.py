"""Tables of an extrapolation document (markdown, HTML, rich), one per evaluation protocol, and the
synthetic task's accuracy table. Numbers with a 95 % interval print as ``mean [low, high]``.

Every function takes the JSON document (document.py) or anything with ``to_dict()`` returning it.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from tokenpos.analysis.extrapolate.document import as_document, load_json

PROTOCOL_TITLES = {"nonoverlap": "non-overlapping windows", "sliding": "sliding window"}


def fmt_ppl(x: float | None) -> str:
    if x is None:
        return "n/a"
    if not math.isfinite(x) or x >= 1e4:
        return f"{x:.2e}"
    return f"{x:.2f}" if x < 1000 else f"{x:.0f}"


def fmt_ratio(x: float | None) -> str:
    """R(k) to 4 decimals (3 made 0.99986 and 1.00020 both print as 1.000)."""
    return "n/a" if x is None else f"{x:.4f}"


def _with_ci(value: float | None, ci: list[float] | None, fmt: Any) -> str:
    text = fmt(value)
    return text if ci is None or value is None else f"{text} [{fmt(ci[0])}, {fmt(ci[1])}]"


def protocols(data: dict[str, Any]) -> list[str]:
    """The protocols present, in first-seen order (rows without one are ``nonoverlap``)."""
    seen: list[str] = []
    for r in as_document(data)["results"]:
        p = r.get("protocol", "nonoverlap")
        if p not in seen:
            seen.append(p)
    return seen


def schemes_in_order(data: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in data["results"]:
        if r["scheme"] not in seen:
            seen.append(r["scheme"])
    return seen


def table(data: Any, protocol: str = "nonoverlap") -> tuple[list[str], list[list[str]]]:
    """Headers and cells for one protocol: one row per scheme, ppl at each length, tail NLL at L, R(k),
    then one row per n-gram baseline (the same scored tokens; no R, it has no positions).

    A scheme that fails the context gate (gate.py) shows "does not use context" in place of its R(k).
    A ``note`` column appears when some scheme could not run somewhere (learned past L). With several
    seeds every number is the mean with its 95 % interval.
    """
    from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, passes

    data = as_document(data)
    L = data["train_len"]
    results = [r for r in data["results"] if r.get("protocol", "nonoverlap") == protocol]
    lens = sorted({r["eval_len"] for r in results})
    by = {(r["scheme"], r["eval_len"]): r for r in results}
    ks = [t // L if t % L == 0 else t / L for t in lens]
    ratios = [f"R({k})" for k, t in zip(ks, lens, strict=True) if t != L]
    nll = "NLL" if protocol == "sliding" else "tail NLL"
    headers = [f"ppl @{t}" for t in lens] + [f"{nll} @{L}"] + ratios
    has_note = any(r.get("note") for r in results)
    headers = ["scheme"] + headers + (["note"] if has_note else [])
    rows = []
    for scheme in schemes_in_order({"results": results}):
        cells = [scheme] + [_with_ci(by[scheme, t]["ppl"], by[scheme, t].get("ppl_ci"), fmt_ppl)
                            if (scheme, t) in by else "" for t in lens]
        base = by.get((scheme, L))
        cells.append("" if base is None or base["tail_nll"] is None else
                     _with_ci(base["tail_nll"], base.get("tail_nll_ci"), lambda x: f"{x:.4f}"))
        cells += [("" if (scheme, t) not in by else
                   FAIL_TEXT if by[scheme, t]["ratio"] is not None and not passes(data, scheme) else
                   _with_ci(by[scheme, t]["ratio"], by[scheme, t].get("ratio_ci"), fmt_ratio)) for t in lens if t != L]
        if has_note:
            notes = sorted({by[scheme, t].get("note") or "" for t in lens if (scheme, t) in by} - {""})
            cells.append("; ".join(notes))
        rows.append(cells)
    for g in data.get("ngram", []):
        if g["protocol"] == protocol:
            rows.append([f"{g['order']}-gram (add-k {g['k']:g})"] + [fmt_ppl(math.exp(g["nll"])) for _ in lens]
                        + [f"{g['nll']:.4f}"] + ["-" for t in lens if t != L] + ([""] if has_note else []))
    return headers, rows


def fmt_p(p: float | None) -> str:
    return "-" if p is None else f"{p:.4f}"


def comparison_table(data: Any) -> tuple[list[str], list[list[str]]]:
    """The pre-registered comparisons: claim, source, mean difference [95 % interval], p, Holm p, verdict."""
    data = as_document(data)
    block = data.get("comparisons")
    if block is None:
        block = {"entries": []}
    rows = []
    for e in block["entries"]:
        diff = "-" if e["difference"] is None else _with_ci(e["difference"], e["ci"], lambda x: f"{x:+.4f}")
        verdict = e["verdict"] + (f" ({e['reason']})" if e["reason"] else "")
        rows.append([f"{e['a']} vs {e['b']}", f"{e['claim']} ({e['source']})", f"{e['metric']} {e['protocol']}",
                     diff, fmt_p(e["p"]), fmt_p(e["p_holm"]), verdict])
    return ["comparison", "paper's claim", "metric", "difference a - b [95%]", "p", "Holm p", "verdict"], rows


def curve_table(data: Any) -> tuple[list[str], list[list[str]]]:
    """Per-position NLL at the longest length (non-overlapping windows): one row per scheme, one column per
    bin of positions, mean [95 % interval] over seeds."""
    data = as_document(data)
    curves = data.get("curves", [])
    if not curves:
        return ["scheme"], []
    longest = max(c["eval_len"] for c in curves)
    chosen = [c for c in curves if c["eval_len"] == longest]
    width = chosen[0]["bin_width"]
    bins = len(chosen[0]["nll"])
    headers = ["scheme"] + [f"pos {i * width}-{(i + 1) * width - 1}" for i in range(bins)]
    return headers, [[c["scheme"]] + [_with_ci(m, ci, lambda x: f"{x:.3f}") for m, ci in zip(c["nll"], c["nll_ci"],
                                                                                          strict=True)]
                     for c in chosen]


def task_table(data: Any, task: str) -> tuple[list[str], list[list[str]]]:
    """Per-token / exact-match accuracy (%) by input length for one synthetic task, one row per scheme (mean over
    its seeds); a scheme below the training target in distribution is marked "not trained" (no claim is made
    from it), or "trained in k of n seeds" where only some of its seeds reached it."""
    entries = [e for e in as_document(data).get("task_results", []) if e["task"] == task]
    lens = sorted({e["length"] for e in entries})
    by = {(e["scheme"], e["length"]): e for e in entries}
    schemes: list[str] = []
    for e in entries:
        if e["scheme"] not in schemes:
            schemes.append(e["scheme"])

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}"

    def cell(e: dict[str, Any] | None) -> str:
        if e is None:
            return ""
        exact = _with_ci(e["accuracy"], e.get("accuracy_ci"), pct)
        return exact if "per_token" not in e else f"{pct(e['per_token'])} / {exact}"

    def status(s: str) -> str:
        e = next(by[s, t] for t in lens if (s, t) in by)
        if "trained_seeds" not in e:                                   # a document written before the count
            return "trained" if e.get("trained", True) else "not trained"
        k, n = len(e["trained_seeds"]), len(e["seeds"])
        return "trained" if k == n else "not trained" if k == 0 else f"trained in {k} of {n} seeds"

    return (["scheme", "status"] + [f"token / exact % @{t}" for t in lens],
            [[s, status(s)] + [cell(by.get((s, t))) for t in lens] for s in schemes])


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def markdown_table(data: Any, protocol: str = "nonoverlap") -> str:
    """The table of one protocol as GitHub markdown."""
    return _markdown(*table(data, protocol))


def markdown_task_table(data: Any, task: str) -> str:
    return _markdown(*task_table(data, task))


def _html(headers: list[str], rows: list[list[str]], caption: str, cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in rows)
    return (f'<div class="table-wrap"><table class="{cls}"><caption>{caption}</caption><thead><tr>{head}</tr>'
            f"</thead><tbody>{body}</tbody></table></div>")


def html_table(data: Any, protocol: str = "nonoverlap") -> str:
    """One protocol's table as an HTML fragment (``<table class="extrapolation">``), every cell escaped."""
    data = as_document(data)
    seeds = "" if "interval" not in data else " Mean over seeds [95% Student-t interval over seeds]."
    what = ("R(k) = NLL at kL / NLL at L (each scored token has at least kL - S tokens of context)."
            if protocol == "sliding" else
            "R(k) = tail NLL at kL / tail NLL at L (tail = last L/2 positions of windows right-aligned on the "
            "same targets at every length).")
    caption = (f"Train short, test long ({html.escape(PROTOCOL_TITLES.get(protocol, protocol))}): trained at "
               f"L = {data['train_len']}, evaluated at k&middot;L. {what}{seeds}")
    return _html(*table(data, protocol), caption, "extrapolation")


def html_section(path: str | Path) -> str | None:
    """An HTML ``<section>`` for the report from a saved JSON file, or None when it does not exist.

    One table per protocol and one per synthetic task, every number with its interval when the run
    had several seeds.
    """
    path = Path(path)
    if not path.is_file():
        return None
    data = load_json(path)
    meta = []
    if "seconds" in data:
        meta.append(f"wall time {data['seconds']:.0f} s")
    if "threads" in data:
        meta.append(f"{data['threads']} threads")
    if "corpus" in data:
        meta.append(f"corpus {data['corpus']}")
    if "interval" in data:
        meta.append(f"intervals: {data['interval']}")
    if data.get("complete") is False:
        meta.append("partial run")
    extra = f"<p>{html.escape(', '.join(meta))}</p>" if meta else ""
    tables = "".join(html_table(data, p) for p in protocols(data))
    for task in sorted({e["task"] for e in data.get("task_results", [])}):
        caption = (f"Synthetic task {html.escape(task)}: exact-match accuracy (%) by input length "
                   f"[95% interval]")
        tables += _html(*task_table(data, task), caption, "extrapolation-task")
    return (f'<section id="extrapolation"><h2>Length extrapolation (tokenpos extrapolate)</h2>{extra}'
            f"{tables}</section>")
