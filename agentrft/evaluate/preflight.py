"""Pre-flight: can this task teach anything? Sample k rollouts per row and look for signal.

GRPO learns only from rows whose k rewards differ, and only if sampling more exposes
better solutions (best-of-k rising with k). No positive sample anywhere means RL has
nothing to reinforce; every sample perfect means there is nothing left to learn. The
verdict says which, with the fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import numpy as np

from agentrft.evaluate.estimators import best_of_k_curve, pass_at_k
from agentrft.evaluate.eval import eval_results
from agentrft.graders import reward_of
from agentrft.types import Group

EPS = 1e-9


class Verdict(StrEnum):
    """What the pre-flight found; its value is the string the reports and summaries hold."""

    BROKEN = "broken"  # too many rollouts discarded or grades failed: fix tools or grader
    NO_REWARD = "no_reward"  # every rollout scored the same low reward: nothing to reinforce
    SATURATED = "saturated"  # (nearly) every row solved on every sample: nothing left to learn
    WEAK_SIGNAL = "weak_signal"  # few rows whose rewards differ, or best-of-k barely rises
    LEARNABLE = "learnable"

    @property
    def worth_training(self) -> bool:
        """Training can learn something: the task is not broken and some reward was found."""
        return self not in (Verdict.BROKEN, Verdict.NO_REWARD)


def learnability(
    groups: Sequence[Group], ks: Sequence[int] = (1, 2, 4, 8), threshold: float = 1.0
) -> dict[str, Any]:
    """The numbers behind the verdict, over rows with at least two graded rollouts."""
    per_row = [[r for r in (reward_of(gr) for gr in g.grades) if not math.isnan(r)] for g in groups]
    rows = [r for r in per_row if len(r) >= 2]
    n_min = min((len(r) for r in rows), default=0)
    ks = [k for k in ks if k <= n_min]
    flat = [x for r in rows for x in r]
    spread = [max(r) - min(r) > EPS for r in rows]
    return {
        "rows": len(groups),
        "rows_scored": len(rows),
        "samples_per_row": n_min,
        "rows_with_signal": float(np.mean(spread)) if rows else 0.0,
        "best_of_k": {str(k): v for k, v in best_of_k_curve(rows, ks).items()},
        "pass_at_k": {
            str(k): float(
                np.mean([pass_at_k(len(r), sum(x >= threshold for x in r), k) for r in rows])
            )
            for k in ks
        }
        if rows
        else {},
        "threshold": threshold,
        "reward_min": min(flat) if flat else math.nan,
        "reward_max": max(flat) if flat else math.nan,
        "reward_mean": float(np.mean(flat)) if flat else math.nan,
        "rows_all_max": float(np.mean([min(r) >= max(flat) - EPS for r in rows])) if rows else 0.0,
    }


def verdict(stats: dict[str, Any], results: dict[str, Any]) -> tuple[Verdict, list[str]]:
    """(verdict, advice)."""
    advice: list[str] = []
    calls = results["tool_calls"]["mean"] * max(1, results["rollouts"] - results["discarded"])
    invalid_share = results["invalid_tool_calls"] / calls if calls else 0.0
    if results["discard_rate"] > 0.2 or results["grader_error_rate"] > 0.2:
        reasons = list(results.get("discard_reasons", {})) + list(results.get("grader_errors", {}))
        return Verdict.BROKEN, [
            f"{results['discard_rate']:.0%} of rollouts were discarded and {results['grader_error_rate']:.0%} of grades failed: fix the tools or the grader before anything else.",
            *[f"reason: {r}" for r in reasons[:5]],
            "Check the grader alone with `agentrft grader run GRADER.json --sample S.json --item I.json`.",
        ]
    if invalid_share > 0.3:
        advice.append(
            f'{invalid_share:.0%} of tool calls did not parse or validate: add worked examples (agentrft.few_shot_messages) whose arguments come from the request, or a prefill such as "<tool_call>".'
        )
    if (
        results["tool_calls"]["mean"] < 0.1
        and results["tool_calls_per_tool"] == {}
        and results.get("rollouts")
    ):
        advice.append(
            "The model almost never calls a tool: show it how in the system prompt and few-shot examples, or prefill the reply."
        )
    if stats["rows_scored"] == 0:
        return Verdict.BROKEN, ["No row got two graded rollouts; nothing can be measured.", *advice]
    if stats["reward_max"] - stats["reward_min"] <= EPS:
        if stats["reward_max"] <= 0 + EPS or stats["reward_max"] < stats["threshold"]:
            return Verdict.NO_REWARD, [
                f"Every rollout scored {stats['reward_max']:.3g}: there is no better sample for RL to reinforce.",
                *advice,
                "Fix the prompt, tools or grader first; make the reward continuous (partial credit) so near-misses count; or raise compute_multiplier so more samples per row are tried.",
            ]
        return Verdict.SATURATED, [
            f"Every rollout already scores {stats['reward_max']:.3g}: the task is too easy to teach anything. Use harder rows or a stricter grader."
        ]
    if stats["rows_all_max"] > 0.9:
        return Verdict.SATURATED, [
            f"{stats['rows_all_max']:.0%} of rows are solved on every sample: little is left to learn. Use harder rows.",
            *advice,
        ]
    ks = sorted(int(k) for k in stats["best_of_k"])
    gain = stats["best_of_k"][str(ks[-1])] - stats["best_of_k"][str(ks[0])] if ks else 0.0
    if stats["rows_with_signal"] < 0.25 or gain < 0.02:
        return Verdict.WEAK_SIGNAL, [
            f"Only {stats['rows_with_signal']:.0%} of rows have rewards that differ across samples (best-of-{ks[-1] if ks else '?'} gains {gain:+.3f}).",
            *advice,
            "Raise compute_multiplier (more samples per row), give partial credit in the grader, or improve the prompt so successes happen more often.",
        ]
    return Verdict.LEARNABLE, [
        f"{stats['rows_with_signal']:.0%} of rows carry signal and best-of-{ks[-1]} is {gain:+.3f} above best-of-{ks[0]}: sampling more finds better answers, which RL can learn from. Train.",
        *advice,
    ]


def preflight(
    groups: Sequence[Group], ks: Sequence[int] = (1, 2, 4, 8), threshold: float = 1.0
) -> dict[str, Any]:
    results = eval_results(groups, threshold)
    stats = learnability(groups, ks, threshold)
    name, advice = verdict(stats, results)
    return {**stats, "verdict": name, "advice": advice, "eval": results}
