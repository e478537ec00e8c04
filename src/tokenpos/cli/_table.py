"""Console tables that never break a number: a :class:`Grid` of cells, printed with rich at the console's width.

A number stays whole on one line: numeric columns never wrap (``no_wrap``) and are at least as wide as their
widest cell; text columns (labels, notes) wrap at spaces and fold only a word longer than their width
(``overflow="fold"``), never a word with a digit; headers wrap at spaces. A grid too wide for the console even at
those least widths is printed as several tables by columns, each repeating the first (label) column, the later
ones titled "(continued)". rich alone cannot promise this: a table wider than the console has every column
narrowed evenly, numbers cut included (``2,004.`` / ``0`` at 80 columns).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

TEXT_MIN = 12            # the narrowest a text column is made (a longer word folds)


def _gaps(columns: int) -> int:
    """Columns of a rich ``box.SIMPLE_HEAD`` table that are not cell text: a space of padding on each side of
    every cell, a separator between cells and an edge on each side."""
    return 2 * columns + (columns - 1) + 2


@dataclass
class Grid:
    """A titled table: ``headers``, rows of strings; the columns in ``text`` hold words (they may wrap), the
    others numbers (never broken)."""

    title: str
    headers: list[str]
    text: frozenset[int] = frozenset({0})
    rows: list[tuple[list[str], str | None]] = field(default_factory=list)

    def add_row(self, *cells: object, style: str | None = None) -> None:
        """One row, a cell per header (ValueError otherwise); ``style`` is rich's (e.g. "bold")."""
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of {self.title!r} needs {len(self.headers)} cells, got {len(cells)}")
        self.rows.append(([str(c) for c in cells], style))

    def widths(self) -> list[tuple[int, int]]:
        """(least, most) text width of each column: least keeps every number and header word whole."""
        from rich.cells import cell_len

        out = []
        for i, header in enumerate(self.headers):
            cells = [cells[i] for cells, _ in self.rows]
            head_word = max((cell_len(w) for w in header.split()), default=1)
            lines = [cell_len(line) for c in [header, *cells] for line in c.splitlines() or [""]]
            if i in self.text:                     # a word with a digit is a number: whole; others may fold
                word = max((cell_len(w) if any(ch.isdigit() for ch in w) else min(cell_len(w), TEXT_MIN)
                            for c in cells for w in c.split()), default=1)
                least = max(word, head_word)
            else:
                least = max([cell_len(c) for c in cells] + [head_word])
            out.append((least, max(least, *lines)))
        return out


def parts(widths: list[tuple[int, int]], width: int) -> list[list[int]]:
    """The columns of each table a grid is printed as, each starting with column 0: as few tables as fit
    ``width`` at the columns' least widths, the columns cut where the widest table is narrowest (balanced); a
    column too wide for any table gets one of its own."""
    def need(columns: list[int]) -> int:
        return sum(widths[j][0] for j in columns) + _gaps(len(columns))

    rest = list(range(1, len(widths)))
    for k in range(1, len(rest) + 1):
        best: list[list[int]] | None = None
        for cuts in itertools.combinations(range(1, len(rest)), k - 1):
            bounds = [0, *cuts, len(rest)]
            split = [[0, *rest[a:b]] for a, b in itertools.pairwise(bounds)]
            if all(need(p) <= width for p in split) and (best is None or max(map(need, split)) < max(map(need, best))):
                best = split
        if best is not None:
            return best
    return [[0, i] for i in rest] or [[0]]


def _spread(widths: list[tuple[int, int]], columns: list[int], text: frozenset[int], width: int) -> list[int]:
    """Each column's width in one table: the most when all fit, else the least plus what is left, given to the
    numeric columns' headers first, then to the text columns."""
    if sum(widths[i][1] for i in columns) + _gaps(len(columns)) <= width:
        return [widths[i][1] for i in columns]
    chosen = {i: widths[i][0] for i in columns}
    spare = width - _gaps(len(columns)) - sum(chosen.values())
    for i in sorted(columns, key=lambda c: c in text):
        add = max(0, min(spare, widths[i][1] - chosen[i]))
        chosen[i] += add
        spare -= add
    return [chosen[i] for i in columns]


def print_grid(con: Any, grid: Grid) -> None:
    """Print ``grid`` on rich console ``con`` at its width (see the module docstring)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    widths = grid.widths()
    for n, columns in enumerate(parts(widths, con.width)):
        table = Table(title=grid.title if n == 0 else f"{grid.title} (continued)", box=box.SIMPLE_HEAD,
                      title_justify="left", title_style="bold")
        for i, w in zip(columns, _spread(widths, columns, grid.text, con.width), strict=True):
            text = i in grid.text
            table.add_column(Text(grid.headers[i], no_wrap=False), width=w, no_wrap=not text,
                             overflow="fold" if text else "ellipsis", justify="left" if text else "right")
        for cells, style in grid.rows:
            table.add_row(*(cells[i] for i in columns), style=style)
        con.print(table)
