"""The context gate: a scheme's extrapolation numbers count only where it beats the 4-gram in distribution.

A model that does not use its context cannot degrade when given more, so its flat R(k) says nothing about
extrapolation. Rule: on the primary protocol (``sliding`` when the run has it, else ``nonoverlap``), the
scheme's mean NLL at L over seeds must be below the add-k 4-gram's NLL on the same scored tokens
(``ngram.py``). Tables print "does not use context" in place of a failing scheme's R(k).
"""

from __future__ import annotations

from typing import Any

GATE_ORDER = 4
FAIL_TEXT = "does not use context"


def primary_protocol(doc: dict[str, Any]) -> str:
    """``sliding`` when the document has it, else ``nonoverlap``."""
    return "sliding" if any(r.get("protocol") == "sliding" for r in doc["results"]) else "nonoverlap"


def context_gate(doc: dict[str, Any]) -> dict[str, Any] | None:
    """``{"protocol", "baseline", "baseline_nll", "rule", "schemes": {name: {"nll_at_L", "passes"}}}`` for a
    document with results and ``ngram`` baselines; None without a 4-gram baseline for the primary protocol."""
    protocol = primary_protocol(doc)
    base = next((g for g in doc.get("ngram", []) if g["order"] == GATE_ORDER and g["protocol"] == protocol), None)
    if base is None:
        return None
    L = doc["train_len"]
    schemes = {}
    for r in doc["results"]:
        if r.get("protocol", "nonoverlap") == protocol and r["eval_len"] == L:
            nll = r["tail_nll"]
            schemes[r["scheme"]] = {"nll_at_L": nll, "passes": nll is not None and nll < base["nll"]}
    return {"protocol": protocol, "baseline": f"{GATE_ORDER}-gram", "baseline_nll": base["nll"],
            "rule": f"mean NLL at L over seeds ({protocol} protocol) below the add-k {GATE_ORDER}-gram's on the "
                    f"same scored tokens", "schemes": schemes}


def passes(doc: dict[str, Any], scheme: str) -> bool:
    """True when ``scheme`` passes the gate (a document without baselines gates nothing)."""
    gate = doc.get("gate")
    if gate is None:
        return True
    entry = gate["schemes"].get(scheme)
    return bool(entry and entry["passes"])
