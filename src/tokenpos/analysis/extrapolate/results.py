"""Results of the extrapolation study: the rows a run produces and their aggregation over seeds into the
JSON document (``ExtrapolationResult.to_dict``; the document's shape and its reading and writing live in
document.py, its tables in render.py).

The document's functions and the tables are re-exported here for the existing imports
(``from tokenpos.analysis.extrapolate.results import write_json, html_table``); both modules are below this
one, so nothing imports back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tokenpos.analysis.extrapolate.document import REQUIRED_KEYS, as_document, dumps, load_json, write_json
from tokenpos.analysis.extrapolate.render import (
    fmt_ppl,
    fmt_ratio,
    html_section,
    html_table,
    markdown_table,
    markdown_task_table,
    protocols,
    schemes_in_order,
    table,
    task_table,
)
from tokenpos.analysis.extrapolate.stats import INTERVAL_NAME, clipped, mean_ci, wilson_interval


@dataclass(frozen=True)
class ResultRow:
    """One scheme at one length, protocol and seed. ``ratio`` = tail NLL here / tail NLL at L."""

    scheme: str
    eval_len: int
    ppl: float | None
    tail_nll: float | None
    ratio: float | None
    note: str | None = None
    protocol: str = "nonoverlap"
    seed: int = 0

    def to_dict(self, *, with_seed: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"scheme": self.scheme, "eval_len": self.eval_len, "ppl": self.ppl,
                               "tail_nll": self.tail_nll, "ratio": self.ratio, "protocol": self.protocol}
        if with_seed:
            out["seed"] = self.seed
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class TaskRow:
    """Exact-match accuracy of one scheme on one synthetic task at one length for one seed (None: cannot run)."""

    scheme: str
    task: str
    length: int
    accuracy: float | None
    seed: int
    examples: int
    note: str | None = None


@dataclass
class SchemeRun:
    """Training facts for one trained scheme and seed (RoPE's scaled variants reuse RoPE's run)."""

    scheme: str
    parameters: int
    train_seconds: float
    eval_seconds: float
    final_loss: float
    losses: list[float] = field(default_factory=list, repr=False)
    seed: int = 0


def _aggregate(rows: list[ResultRow]) -> list[dict[str, Any]]:
    """Entries per (scheme, length, protocol) in first-seen order: mean and 95 % interval over seeds."""
    groups: dict[tuple[str, int, str], list[ResultRow]] = {}
    for r in rows:
        groups.setdefault((r.scheme, r.eval_len, r.protocol), []).append(r)
    out = []
    for (scheme, eval_len, protocol), rs in groups.items():
        entry: dict[str, Any] = {"scheme": scheme, "eval_len": eval_len, "protocol": protocol,
                                 "seeds": [r.seed for r in rs]}
        for key in ("ppl", "tail_nll", "ratio"):
            values = [getattr(r, key) for r in rs]
            if any(v is None for v in values):
                entry[key], entry[f"{key}_ci"] = None, None
            else:
                entry[key], entry[f"{key}_ci"] = mean_ci(values)
        notes = sorted({r.note for r in rs if r.note})
        if notes:
            entry["note"] = "; ".join(notes)
        out.append(entry)
    return out


def _aggregate_tasks(rows: list[TaskRow]) -> list[dict[str, Any]]:
    """Task entries: mean accuracy over seeds with a t-interval, or a Wilson interval for one seed."""
    groups: dict[tuple[str, str, int], list[TaskRow]] = {}
    for r in rows:
        groups.setdefault((r.scheme, r.task, r.length), []).append(r)
    out = []
    for (scheme, task, length), rs in groups.items():
        entry: dict[str, Any] = {"scheme": scheme, "task": task, "length": length, "seeds": [r.seed for r in rs]}
        known = [float(r.accuracy) for r in rs if r.accuracy is not None]
        if len(known) < len(rs):
            entry.update(accuracy=None, accuracy_ci=None, interval=None,
                         note="; ".join(sorted({r.note or "n/a (cannot represent positions >= L)" for r in rs})))
        elif len(rs) == 1:
            entry.update(accuracy=known[0], accuracy_ci=wilson_interval(known[0], rs[0].examples),
                         interval=f"95% Wilson interval over {rs[0].examples} eval examples (one seed)")
        else:
            mean, ci = mean_ci(known)
            entry.update(accuracy=mean, accuracy_ci=clipped(ci, 0.0, 1.0), interval=INTERVAL_NAME)
        out.append(entry)
    return out


@dataclass
class ExtrapolationResult:
    """Everything a run produced: per-seed rows, training facts, task rows, timing, the config."""

    config: Any
    rows: list[ResultRow]
    runs: list[SchemeRun]
    corpus: str
    vocab_size: int
    train_chars: int
    eval_chars: int
    eval_tokens: int
    seconds: float
    threads: int
    task_rows: list[TaskRow] = field(default_factory=list)
    complete: bool = True

    @property
    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.rows} | {t.seed for t in self.task_rows})

    def row(self, scheme: str, eval_len: int, protocol: str = "nonoverlap", seed: int | None = None) -> ResultRow:
        return next(r for r in self.rows if r.scheme == scheme and r.eval_len == eval_len
                    and r.protocol == protocol and (seed is None or r.seed == seed))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (module docstring). One seed: the per-seed rows themselves."""
        multi = len({r.seed for r in self.rows}) > 1
        doc: dict[str, Any] = {
            "train_len": self.config.train_len,
            "results": _aggregate(self.rows) if multi else [r.to_dict() for r in self.rows],
        }
        if multi:
            doc["interval"] = INTERVAL_NAME
            doc["seed_results"] = [r.to_dict(with_seed=True) for r in self.rows]
        if self.task_rows:
            doc["task_results"] = _aggregate_tasks(self.task_rows)
            doc["task_seed_results"] = [asdict(t) for t in self.task_rows]
        doc.update({
            "config": _plain(asdict(self.config)),
            "runs": [{"scheme": r.scheme, "seed": r.seed, "parameters": r.parameters,
                      "train_seconds": round(r.train_seconds, 2), "eval_seconds": round(r.eval_seconds, 2),
                      "final_train_loss": round(r.final_loss, 4)} for r in self.runs],
            "corpus": self.corpus, "vocab_size": self.vocab_size, "train_chars": self.train_chars,
            "eval_chars": self.eval_chars, "eval_tokens_per_length": self.eval_tokens,
            "seconds": round(self.seconds, 2), "threads": self.threads, "complete": self.complete,
        })
        return doc


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively (a JSON-ready config)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


__all__ = ["REQUIRED_KEYS", "ExtrapolationResult", "ResultRow", "SchemeRun", "TaskRow", "as_document", "fmt_ppl",
           "fmt_ratio", "html_section", "html_table", "load_json", "markdown_table", "schemes_in_order", "table",
           "task_table", "write_json", "markdown_task_table", "protocols", "dumps"]
