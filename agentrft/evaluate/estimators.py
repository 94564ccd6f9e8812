"""Unbiased estimators over k of n sampled rollouts per prompt: pass@k and best-of-k.

Pre-flight asks whether best-of-k rises with k (a learnable signal), and the report plots
it. Sampling n rollouts and estimating the k-sample statistic from all C(n, k) subsets is
far less noisy than literally drawing k (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", for pass@k).

`paired_difference` is the before/after test the recipes report: per-row differences of
a score, their mean and a 95% t-interval.

Both estimators are exact: binomial coefficients are Python integers and their ratio is
one correctly rounded division, so nothing overflows or cancels for n in the hundreds
(or thousands).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _check(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples, drawn without replacement from n with c correct, is
    correct) = 1 - C(n-c, k) / C(n, k)."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def best_of_k(rewards: Sequence[float], k: int) -> float:
    """E[max reward of k samples drawn without replacement from `rewards`] (n = len).

    With the rewards sorted ascending, r_(i) is the maximum of exactly C(i-1, k-1) of the
    C(n, k) subsets (ties broken by position, which leaves the expectation unchanged), so
    E = sum_i r_(i) * C(i-1, k-1) / C(n, k). With 0/1 rewards this equals pass@k.
    """
    n = len(rewards)
    _check(n, k)
    total = math.comb(n, k)
    ordered = sorted(float(r) for r in rewards)
    return math.fsum(r * (math.comb(i, k - 1) / total) for i, r in enumerate(ordered) if i >= k - 1)


def best_of_k_curve(
    rewards_by_prompt: Iterable[Sequence[float]], ks: Sequence[int] | None = None
) -> dict[int, float]:
    """Mean over prompts of best_of_k, for each k. `ks` defaults to 1..min n; a k larger
    than some prompt's sample count is left out (the estimate would not be defined)."""
    groups = [list(g) for g in rewards_by_prompt if len(g)]
    if not groups:
        return {}
    n_min = min(len(g) for g in groups)
    ks = list(range(1, n_min + 1)) if ks is None else [k for k in ks if 1 <= k <= n_min]
    return {k: math.fsum(best_of_k(g, k) for g in groups) / len(groups) for k in ks}


def rewards_by_prompt(records: Iterable[Mapping[str, object]]) -> list[list[float]]:
    """Group rollout records (`agentrft.rollout.records.to_record` dicts) by `row`, keeping
    graded, non-discarded rollouts: the input best_of_k_curve takes."""
    groups: dict[object, list[float]] = {}
    for rec in records:
        reward = rec.get("reward")
        if rec.get("discarded") or not isinstance(reward, int | float):
            continue
        groups.setdefault(rec.get("row"), []).append(float(reward))
    return list(groups.values())


def row_means(records: Iterable[Mapping[str, Any]], score: str | None = None) -> dict[Any, float]:
    """row -> mean of its graded, non-discarded rollouts' reward, or of sub-score `score`
    (e.g. "files"): the per-row numbers a paired before/after comparison takes."""
    groups: dict[Any, list[float]] = {}
    for rec in records:
        grade = rec.get("grade") or {}
        value = rec.get("reward") if score is None else (grade.get("sub_scores") or {}).get(score)
        if rec.get("discarded") or grade.get("error") or not isinstance(value, int | float):
            continue
        groups.setdefault(rec.get("row"), []).append(float(value))
    return {row: math.fsum(v) / len(v) for row, v in groups.items()}


@dataclass(frozen=True)
class PairedDifference:
    """after - before over the rows both evaluated: the mean and its 95% t-interval."""

    n: int
    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:+.3f} (95% interval {self.low:+.3f} .. {self.high:+.3f}, n={self.n})"


def paired_difference(diffs: Sequence[float], confidence: float = 0.95) -> PairedDifference:
    """Mean of per-row differences and its two-sided t-interval (rows are the unit: each row is
    scored before and after, so the row-to-row spread cancels out)."""
    from scipy import stats  # lazy: a plain import of agentrft stays fast

    n = len(diffs)
    if n == 0:
        raise ValueError("no rows to compare")
    mean = math.fsum(diffs) / n
    if n == 1:
        return PairedDifference(1, mean, -math.inf, math.inf)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half)
