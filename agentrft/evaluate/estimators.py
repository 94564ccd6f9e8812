"""Unbiased estimators over k of n sampled rollouts per prompt: pass@k and best-of-k.

Pre-flight asks whether best-of-k rises with k (a learnable signal), and the report plots
it. Sampling n rollouts and estimating the k-sample statistic from all C(n, k) subsets is
far less noisy than literally drawing k (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", for pass@k).

Both estimators are exact: binomial coefficients are Python integers and their ratio is
one correctly rounded division, so nothing overflows or cancels for n in the hundreds
(or thousands).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


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


def best_of_k_curve(rewards_by_prompt: Iterable[Sequence[float]], ks: Sequence[int] | None = None) -> dict[int, float]:
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
