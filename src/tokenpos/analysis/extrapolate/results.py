"""JSON and tables for extrapolation results. Everything here works on the JSON document (a dict)
so a saved ``--json`` file renders exactly like a fresh run.

Document: ``{"train_len": L, "results": [{"scheme", "eval_len", "ppl", "tail_nll", "ratio"[, "note"]}, ...]}``
(plus run metadata). ``None`` values mean "cannot run at this length" and carry a ``note``.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from tokenpos.tables.errors import ConfigError

REQUIRED_KEYS = ("scheme", "eval_len", "ppl", "tail_nll", "ratio")


def as_document(result: Any) -> dict[str, Any]:
    """An ``ExtrapolationResult`` or an already-loaded document -> the document dict."""
    return result.to_dict() if hasattr(result, "to_dict") else result


def write_json(result: Any, path: str | Path) -> Path:
    """Write the document (2-space indent, NaN/inf refused) and return the path."""
    path = Path(path)
    path.write_text(json.dumps(as_document(result), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def load_json(path: str | Path) -> dict[str, Any]:
    """Read and check a document written by ``write_json``.

    Raises:
        ConfigError: the file is not an extrapolation document.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    ok = isinstance(data, dict) and isinstance(data.get("train_len"), int) and isinstance(data.get("results"), list)
    if ok:
        ok = all(isinstance(r, dict) and all(k in r for k in REQUIRED_KEYS) for r in data["results"])
    if not ok:
        raise ConfigError(f"{path} is not an extrapolation result; expected {{'train_len': int, 'results': "
                          f"[{{{', '.join(REQUIRED_KEYS)}}}, ...]}}")
    return data


def fmt_ppl(x: float | None) -> str:
    if x is None:
        return "n/a"
    if not math.isfinite(x) or x >= 1e4:
        return f"{x:.2e}"
    return f"{x:.2f}" if x < 1000 else f"{x:.0f}"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def schemes_in_order(data: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in data["results"]:
        if r["scheme"] not in seen:
            seen.append(r["scheme"])
    return seen


def table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and string cells: one row per scheme, ppl at each length, tail NLL at L, R(k) for k > 1.

    A ``note`` column appears when some scheme could not run somewhere (learned past L).
    """
    data = as_document(data)
    L = data["train_len"]
    lens = sorted({r["eval_len"] for r in data["results"]})
    by = {(r["scheme"], r["eval_len"]): r for r in data["results"]}
    ks = [t // L if t % L == 0 else t / L for t in lens]
    ratios = [f"R({k})" for k, t in zip(ks, lens, strict=True) if t != L]
    headers = [f"ppl @{t}" for t in lens] + [f"tail NLL @{L}"] + ratios
    has_note = any(r.get("note") for r in data["results"])
    headers = ["scheme"] + headers + (["note"] if has_note else [])
    rows = []
    for scheme in schemes_in_order(data):
        cells = [scheme] + [fmt_ppl(by[scheme, t]["ppl"]) if (scheme, t) in by else "" for t in lens]
        base = by.get((scheme, L))
        cells.append("" if base is None or base["tail_nll"] is None else f"{base['tail_nll']:.4f}")
        cells += [fmt_ratio(by[scheme, t]["ratio"]) if (scheme, t) in by else "" for t in lens if t != L]
        if has_note:
            notes = sorted({by[scheme, t].get("note") or "" for t in lens if (scheme, t) in by} - {""})
            cells.append("; ".join(notes))
        rows.append(cells)
    return headers, rows


def markdown_table(data: dict[str, Any]) -> str:
    """The table as GitHub markdown."""
    headers, rows = table(data)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def html_table(data: dict[str, Any]) -> str:
    """The table as an HTML fragment (``<table class="extrapolation">``), every cell escaped."""
    data = as_document(data)
    headers, rows = table(data)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in rows)
    caption = (f"Train short, test long: trained at L = {data['train_len']}, evaluated at k&middot;L. "
               "R(k) = tail NLL at kL / tail NLL at L (tail = last L/2 positions of each window).")
    return (f'<table class="extrapolation"><caption>{caption}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def html_section(path: str | Path) -> str | None:
    """An HTML ``<section>`` for the report from a saved JSON file, or None when it does not exist."""
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
    extra = f"<p>{html.escape(', '.join(meta))}</p>" if meta else ""
    return (f'<section id="extrapolation"><h2>Length extrapolation (tokenpos extrapolate)</h2>{extra}'
            f"{html_table(data)}</section>")
