"""The pre-registered comparisons: a short list fixed before the run, Holm-corrected, with a smallest
difference that counts.

Each comparison is a paper's claim that scheme ``a`` extrapolates better than scheme ``b``: a smaller
R(k) at the longest length on the primary protocol. Per seed the difference ``R_a - R_b`` (both schemes
share the seed's data order), its mean, 95 % t-interval and paired t-test p-value; the p-values of the
comparisons that are tested (both schemes ran and pass the context gate) are Holm-adjusted together.

Verdict: ``agree`` when the Holm p < ALPHA and the mean difference is at least SMALLEST in the claim's
direction; ``disagree`` when so in the other direction; otherwise ``not resolved`` (the reason says
which: "no difference detected", a difference below SMALLEST, a scheme that does not use context, or
one not run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, passes, primary_protocol
from tokenpos.analysis.extrapolate.stats import holm, mean_ci, paired_t_pvalue

ALPHA = 0.05
SMALLEST = 0.01      # smallest difference in R(k) that counts: 1 % of the NLL at L


@dataclass(frozen=True)
class Comparison:
    """``a`` has a smaller R(k_max) than ``b`` (``claim``, from ``source``)."""

    a: str
    b: str
    claim: str
    source: str


PREREGISTERED = (
    Comparison("alibi", "sinusoidal", "ALiBi extrapolates, sinusoidal does not", "Press et al. 2022, Fig. 1"),
    Comparison("alibi", "rope", "ALiBi extrapolates better than rotary", "Press et al. 2022, Fig. 1"),
    Comparison("t5", "rope", "the T5 bias extrapolates better than rotary", "Press et al. 2022, Fig. 1"),
    Comparison("rope", "sinusoidal", "rotary degrades less than sinusoidal", "Press et al. 2022, Fig. 1"),
    Comparison("nope", "rope", "NoPE generalises to longer inputs better than RoPE", "Kazemnejad et al. 2023"),
    Comparison("fire", "alibi", "FIRE generalises better than ALiBi", "Li et al. 2024 (FIRE)"),
    Comparison("kerple", "alibi", "KERPLE extrapolates better than ALiBi", "Chi et al. 2022 (KERPLE)"),
    Comparison("irope", "rope", "interleaved NoPE layers improve length generalisation", "Meta 2025 (Llama 4)"),
    Comparison("rope+yarn", "rope", "YaRN scaling beats unscaled RoPE beyond L", "Peng et al. 2023 (YaRN)"),
)


def _per_seed(doc: dict[str, Any], scheme: str, eval_len: int, protocol: str) -> dict[int, float]:
    rows = doc.get("seed_results")
    if rows is None:                                                     # a one-seed document of v2
        rows = [dict(r, seed=doc["config"]["seed"]) for r in doc["results"]]
    return {r["seed"]: r["ratio"] for r in rows if r["scheme"] == scheme and r["eval_len"] == eval_len
            and r.get("protocol", "nonoverlap") == protocol and r["ratio"] is not None}


def evaluate(doc: dict[str, Any], comparisons: tuple[Comparison, ...] = PREREGISTERED) -> list[dict[str, Any]]:
    """One entry per comparison (module docstring), in the pre-registered order."""
    protocol = primary_protocol(doc)
    longest = max(r["eval_len"] for r in doc["results"])
    k = longest // doc["train_len"]
    out: list[dict[str, Any]] = []
    for c in comparisons:
        entry: dict[str, Any] = {"a": c.a, "b": c.b, "claim": c.claim, "source": c.source, "protocol": protocol,
                                 "metric": f"R({k})", "difference": None, "ci": None, "p": None, "p_holm": None,
                                 "seeds": 0}
        va, vb = _per_seed(doc, c.a, longest, protocol), _per_seed(doc, c.b, longest, protocol)
        seeds = sorted(set(va) & set(vb))
        failing = [s for s in (c.a, c.b) if not passes(doc, s)]
        if not seeds:
            entry.update(verdict="not resolved", reason="not run")
        elif failing:
            entry.update(verdict="not resolved", reason=f"{FAIL_TEXT}: {', '.join(failing)}")
        else:
            diffs = [va[s] - vb[s] for s in seeds]
            mean, ci = mean_ci(diffs)
            entry.update(difference=mean, ci=ci, p=paired_t_pvalue(diffs), seeds=len(seeds))
        out.append(entry)
    tested = [e for e in out if e["p"] is not None]
    for e, p in zip(tested, holm([e["p"] for e in tested]), strict=True):
        e["p_holm"] = p
    for e in out:
        if "verdict" in e:
            continue
        if e["p_holm"] is None:
            e.update(verdict="not resolved", reason="one seed: no test")
        elif e["p_holm"] >= ALPHA:
            e.update(verdict="not resolved", reason="no difference detected")
        elif abs(e["difference"]) < SMALLEST:
            e.update(verdict="not resolved", reason=f"difference below {SMALLEST}")
        else:
            e.update(verdict="agree" if e["difference"] < 0 else "disagree", reason="")
    return out
