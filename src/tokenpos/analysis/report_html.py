"""HTML building blocks of the report: escaped tables, embedded figures, sections, the page and its CSS.

Everything returns strings; every text that comes from data is escaped here.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from pathlib import Path

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde1e8; --accent: #2b5fab; --bg-alt: #f6f7f9; }
* { box-sizing: border-box; }
body { font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       max-width: 1180px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.7em; margin: 0 0 4px; }
h2 { font-size: 1.3em; margin: 42px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.05em; margin: 26px 0 8px; }
p, li { max-width: 90ch; }
.meta, .note, caption, figcaption { color: var(--muted); font-size: 0.9em; }
nav ol { columns: 2; padding-left: 1.2em; }
a { color: var(--accent); }
.table-wrap { max-width: 100%; overflow-x: auto; margin: 8px 0 18px; }
table { border-collapse: collapse; font-size: 0.88em; }
caption { caption-side: top; text-align: left; padding-bottom: 4px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--bg-alt); text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.total td { font-weight: 600; }
table.extrapolation td:not(:first-child) { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 18px 0 28px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
code { background: var(--bg-alt); padding: 1px 4px; border-radius: 3px; }
.warn { border-left: 4px solid #d08a00; background: #fff8e8; padding: 6px 12px; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Iterable[int] | None = None,
          caption: str | None = None, total_last: bool = False, cls: str = "") -> str:
    """An HTML table; ``numeric`` columns (default: all but the first) are right-aligned."""
    rows = [list(r) for r in rows]
    num = set(range(1, len(headers))) if numeric is None else set(numeric)

    def cell(tag: str, i: int, value: object) -> str:
        klass = ' class="num"' if i in num else ""
        return f"<{tag}{klass}>{esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        klass = ' class="total"' if total_last and r == len(rows) - 1 else ""
        body.append(f"<tr{klass}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    klass = f' class="{esc(cls)}"' if cls else ""
    return wrap(f"<table{klass}>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def wrap(table_html: str) -> str:
    """A table inside a box that scrolls sideways (CSS ``.table-wrap``): a wide table never widens the page
    past a narrow viewport (800 px)."""
    return f'<div class="table-wrap">{table_html}</div>'



def figure(png: Path, caption: str, alt: str) -> str:
    """The PNG embedded as a data URI (self-contained page), its file name kept in ``data-file`` and a link."""
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    name = esc(Path(png).name)
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}" data-file="{name}">'
            f'<figcaption>{esc(caption)} (<a href="{name}">{name}</a>)</figcaption></figure>')


def paragraphs(texts: Iterable[str], cls: str = "") -> str:
    klass = f' class="{esc(cls)}"' if cls else ""
    return "".join(f"<p{klass}>{esc(t)}</p>" for t in texts)


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, meta: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """The whole document. ``sections``: (anchor, title, body html); a table of contents links them."""
    toc = "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t, _ in sections)
    body = "".join(section(a, t, b) for a, t, b in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f'<header><h1>{esc(title)}</h1><p class="meta">{meta}</p></header>'
            f"<nav><ol>{toc}</ol></nav>{body}</body></html>\n")
