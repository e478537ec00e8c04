"""The JSON document of an extrapolation run: its shape, writing it, reading and checking it.

Tables and plots work on this document (a dict), so a saved ``--json`` file renders exactly like a fresh
run. A leaf: it imports nothing of the study (results.py builds the document, render.py draws it).

Document: ``{"train_len": L, "results": [{"scheme", "eval_len", "ppl", "tail_nll", "ratio", "protocol"
[, "note"]}, ...]}`` plus run metadata. With several seeds each entry holds the mean over seeds in
``ppl`` / ``tail_nll`` / ``ratio`` and adds ``seeds``, ``ppl_ci``, ``tail_nll_ci`` and ``ratio_ci``
(95 %, ``stats.INTERVAL_NAME``); the per-seed numbers are kept in ``seed_results``. The synthetic
task writes ``task_results``: ``[{"scheme", "task", "length", "accuracy", "accuracy_ci", "seeds",
"interval", "per_token", "per_token_ci", "trained"}]``. ``None`` values mean "cannot run at this length" and
carry a ``note``. Science v3 adds ``ngram`` (the add-k baselines on each protocol's scored tokens), ``gate``
(gate.py), ``comparisons`` (the pre-registered list with p-values and Holm-adjusted ones, comparisons.py),
``curves`` (NLL by position bin) and ``command`` (the command line that ran the study).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenpos._files import atomic_write_text
from tokenpos.tables.errors import ConfigError

REQUIRED_KEYS = ("scheme", "eval_len", "ppl", "tail_nll", "ratio")


def as_document(result: Any) -> dict[str, Any]:
    """An ``ExtrapolationResult`` (anything with ``to_dict()``) or an already-loaded document -> the document."""
    return result.to_dict() if hasattr(result, "to_dict") else result


def dumps(result: Any) -> str:
    """The document as JSON text (2-space indent, NaN/inf refused)."""
    return json.dumps(as_document(result), indent=2, allow_nan=False) + "\n"


def write_json(result: Any, path: str | Path) -> Path:
    """Write the document atomically (``tokenpos._files``) and return the path."""
    return atomic_write_text(path, dumps(result))


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
