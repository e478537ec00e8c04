"""Seeds and intervals: the mean and a 95 % Student-t interval over seeds.

For n seeds with values x_1..x_n: ``mean +- t_{0.975, n-1} * s / sqrt(n)``, s the sample standard
deviation (ddof 1). The t quantiles are tabulated for n - 1 = 1..30 (beyond that, 1.96: the normal
quantile, slightly too narrow for 31..60 seeds). One seed has no interval: ``[x, x]`` is *not*
returned; the interval is None. The interval describes the variation over training seeds (init and
data order) only; the evaluation text is the same for every seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# two-sided 95 %: t_{0.975, df} for df = 1..30
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
INTERVAL_NAME = "95% Student-t interval over seeds (mean +- t_{0.975,n-1} * sd / sqrt(n))"


def t_quantile(df: int) -> float:
    """t_{0.975, df} (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T975[df - 1] if df <= len(T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, list[float] | None]:
    """(mean, [low, high]) of ``values``; the interval is None for a single value.

    Raises:
        ValueError: no values.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_ci needs at least one value, got none")
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, [mean - half, mean + half]


def clipped(ci: list[float] | None, low: float, high: float) -> list[float] | None:
    """An interval clipped to [low, high] (accuracies live in [0, 1])."""
    return None if ci is None else [max(low, ci[0]), min(high, ci[1])]


def wilson_interval(accuracy: float, n: int, z: float = 1.96) -> list[float]:
    """The 95 % Wilson score interval of a proportion ``accuracy`` observed on ``n`` examples."""
    if n < 1:
        raise ValueError(f"wilson_interval needs n >= 1 examples, got {n}")
    p = float(accuracy)
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def paired_difference(seed_results: Sequence[dict], a: str, b: str, *, key: str, eval_len: int,
                      protocol: str = "nonoverlap") -> tuple[float, list[float] | None, int]:
    """Mean and 95 % t-interval of the per-seed difference ``a - b`` in ``key`` (e.g. "ratio", "ppl").

    Every scheme of a seed shares that seed's data order and block initialisation, so the paired
    difference removes the seed-to-seed variation the schemes have in common; its interval is much
    narrower than the two separate intervals suggest. Returns (mean, interval or None, seeds used).

    Raises:
        ValueError: no seed has both schemes with a number there.
    """
    def values(name: str) -> dict[int, float]:
        return {r["seed"]: r[key] for r in seed_results if r["scheme"] == name and r["eval_len"] == eval_len
                and r.get("protocol", "nonoverlap") == protocol and r[key] is not None}

    va, vb = values(a), values(b)
    seeds = sorted(set(va) & set(vb))
    if not seeds:
        raise ValueError(f"no seed has both {a!r} and {b!r} with {key} at {eval_len} ({protocol})")
    mean, ci = mean_ci([va[s] - vb[s] for s in seeds])
    return mean, ci, len(seeds)


def paired_t_pvalue(differences: Sequence[float]) -> float | None:
    """Two-sided p-value of a paired t-test that the mean of ``differences`` is 0 (None for one value).

    All differences equal: p = 1 when they are 0, else 0 (no spread at all).
    """
    from scipy.stats import t as student_t

    xs = [float(v) for v in differences]
    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return float(2.0 * student_t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the order given.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    (No installed library has it: scipy.stats has only Benjamini-Hochberg, statsmodels is not installed.)
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out
