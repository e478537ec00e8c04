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
    curve: list[float] | None = None       # mean NLL per bin of positions (nonoverlap), in ``curves``

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
    """Exact-match and per-token accuracy of one scheme on one synthetic task at one length for one seed
    (None: cannot run); ``trained``: the per-token accuracy at the training length reached the target."""

    scheme: str
    task: str
    length: int
    accuracy: float | None
    seed: int
    examples: int
    note: str | None = None
    per_token: float | None = None
    trained: bool = True
    steps: int | None = None


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
        entry: dict[str, Any] = {"scheme": scheme, "task": task, "length": length, "seeds": [r.seed for r in rs],
                                 "trained": all(r.trained for r in rs),
                                 "trained_seeds": [r.seed for r in rs if r.trained]}
        tokens = [r.per_token for r in rs]
        if all(v is not None for v in tokens):
            mean, ci = mean_ci([float(v) for v in tokens if v is not None])
            entry.update(per_token=mean, per_token_ci=clipped(ci, 0.0, 1.0))
        else:
            entry.update(per_token=None, per_token_ci=None)
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
    ngram: list[dict[str, Any]] = field(default_factory=list)
    command: str | None = None

    @property
    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.rows} | {t.seed for t in self.task_rows})

    def row(self, scheme: str, eval_len: int, protocol: str = "sliding", seed: int | None = None) -> ResultRow:
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
        if self.ngram:
            doc["ngram"] = self.ngram
        curves = _curves(self.rows, self.config.train_len)
        if curves:
            doc["curves"] = curves
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
            "command": self.command,
        })
        return with_analysis(doc)


def with_analysis(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` plus what is computed from its numbers: the context gate and the pre-registered comparisons."""
    from tokenpos.analysis.extrapolate.comparisons import ALPHA, SMALLEST, evaluate
    from tokenpos.analysis.extrapolate.gate import context_gate

    gate = context_gate(doc)
    if gate is not None:
        doc["gate"] = gate
    if doc["results"]:
        doc["comparisons"] = {"alpha": ALPHA, "smallest_difference": SMALLEST, "correction": "Holm",
                              "test": "two-sided paired t-test over seeds", "entries": evaluate(doc)}
    return doc


def _curves(rows: list[ResultRow], train_len: int) -> list[dict[str, Any]]:
    """Per (scheme, length): the NLL by position bin, mean over seeds with its 95 % interval per bin."""
    groups: dict[tuple[str, int], list[ResultRow]] = {}
    for r in rows:
        if r.curve is not None:
            groups.setdefault((r.scheme, r.eval_len), []).append(r)
    out = []
    for (scheme, eval_len), rs in groups.items():
        stats = [mean_ci([r.curve[i] for r in rs if r.curve is not None]) for i in range(len(rs[0].curve or []))]
        out.append({"scheme": scheme, "eval_len": eval_len, "protocol": "nonoverlap",
                    "bin_width": max(1, train_len // 2), "seeds": [r.seed for r in rs],
                    "nll": [m for m, _ in stats], "nll_ci": [ci for _, ci in stats],
                    "seed_nll": [r.curve for r in rs]})
    return out


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
