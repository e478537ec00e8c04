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


def explain(doc: dict[str, Any], default_steps: int) -> list[str]:
    """What a reader should take from the gate in ``doc``: which schemes fail it and why their R(k) is hidden,
    and, for a run trained fewer than ``default_steps`` steps (``--quick``), what such a run can and cannot show.
    Empty for a document without a gate."""
    gate = doc.get("gate")
    if gate is None:
        return []
    config = doc.get("config")
    steps = None if config is None else config.get("steps")
    short = isinstance(steps, int) and steps < default_steps
    failing = [s for s, e in gate["schemes"].items() if not e["passes"]]
    out = []
    if failing:
        out.append(f"'{FAIL_TEXT}': {', '.join(failing)} did not beat the {gate['baseline']} baseline at L "
                   f"(NLL {gate['baseline_nll']:.4f}, {gate['protocol']} protocol), so their R(k) is not shown: a "
                   "model that ignores its context cannot get worse when given more of it, and its flat R(k) "
                   "would say nothing about extrapolation.")
    if short and failing and len(failing) == len(gate["schemes"]):
        out.append(f"This run trained {steps} steps per scheme (the default run: {default_steps}): too few for any "
                   f"model to learn to use its context, so '{FAIL_TEXT}' here is an artefact of the short training, "
                   "not a finding about the schemes. A quick run shows that the study runs end to end; compare "
                   "schemes on the default run (`tokenpos extrapolate --seed 0`) or on the study shipped with "
                   "tokenpos (five seeds, in `tokenpos report`).")
    elif short:
        out.append(f"This run trained {steps} steps per scheme (the default run: {default_steps}): schemes still "
                   f"short of the baseline may only be undertrained, and one seed's R(k) has no interval; compare "
                   "schemes on the default run (`tokenpos extrapolate --seed 0`, --seeds for intervals) or on the "
                   "study shipped with tokenpos (in `tokenpos report`).")
    elif failing and len(failing) == len(gate["schemes"]):
        out.append("No scheme used its context: train longer (--steps) or a wider model (--d-model) before "
                   "reading R(k).")
    return out
