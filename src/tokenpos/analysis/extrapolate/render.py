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
    return "n/a" if x is None else f"{x:.3f}"


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
    """Headers and cells for one protocol: one row per scheme, ppl at each length, tail NLL at L, R(k).

    A ``note`` column appears when some scheme could not run somewhere (learned past L). With several
    seeds every number is the mean with its 95 % interval.
    """
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
        cells += [_with_ci(by[scheme, t]["ratio"], by[scheme, t].get("ratio_ci"), fmt_ratio)
                  if (scheme, t) in by else "" for t in lens if t != L]
        if has_note:
            notes = sorted({by[scheme, t].get("note") or "" for t in lens if (scheme, t) in by} - {""})
            cells.append("; ".join(notes))
        rows.append(cells)
    return headers, rows


def task_table(data: Any, task: str) -> tuple[list[str], list[list[str]]]:
    """Exact-match accuracy (%) by input length for one synthetic task, one row per scheme."""
    entries = [e for e in as_document(data).get("task_results", []) if e["task"] == task]
    lens = sorted({e["length"] for e in entries})
    by = {(e["scheme"], e["length"]): e for e in entries}
    schemes: list[str] = []
    for e in entries:
        if e["scheme"] not in schemes:
            schemes.append(e["scheme"])

    def cell(e: dict[str, Any] | None) -> str:
        if e is None:
            return ""
        return _with_ci(e["accuracy"], e.get("accuracy_ci"), lambda x: "n/a" if x is None else f"{100 * x:.0f}")

    return ["scheme"] + [f"acc % @{t}" for t in lens], [[s] + [cell(by.get((s, t))) for t in lens] for s in schemes]


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
    return (f'<table class="{cls}"><caption>{caption}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def html_table(data: Any, protocol: str = "nonoverlap") -> str:
    """One protocol's table as an HTML fragment (``<table class="extrapolation">``), every cell escaped."""
    data = as_document(data)
    seeds = "" if "interval" not in data else " Mean over seeds [95% Student-t interval over seeds]."
    what = ("R(k) = NLL at kL / NLL at L (each scored token has at least kL - S tokens of context)."
            if protocol == "sliding" else
            "R(k) = tail NLL at kL / tail NLL at L (tail = last L/2 positions of each window).")
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
