"""The statistics of graded rollouts: rewards, tool use, tokens, latency, stop reasons.

Shared by `agentrft eval` (baseline and trained models), `agentrft preflight` and the
training loop's periodic evaluation, which all get their rollouts from `rollout/` and their
grades from `graders/`: the same numbers mean the same thing everywhere.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrft.graders.groups import reward_of
from agentrft.rollout.records import distribution, summarize, to_record
from agentrft.types import Group, Origin, Trajectory


def reward_stats(groups: Sequence[Group], pass_threshold: float | None = None) -> dict[str, Any]:
    """Reward mean/std, each sub-grader's mean, grader errors, pass rate and zero-signal
    groups, over the rollouts that have a reward."""
    rewards = [reward_of(gr) for g in groups for gr in g.grades]
    kept = [r for r in rewards if not math.isnan(r)]
    subs: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    for g in groups:
        for gr in g.grades:
            if gr is None:
                continue
            if gr.error:
                errors[gr.error] += 1
                continue
            for name, v in gr.sub_scores.items():
                subs[name].append(float(v))
    per_group = [[reward_of(gr) for gr in g.grades] for g in groups]
    flat = [[r for r in rs if not math.isnan(r)] for rs in per_group]
    out: dict[str, Any] = {
        "reward": {
            "mean": float(np.mean(kept)) if kept else math.nan,
            "std": float(np.std(kept)) if kept else math.nan,
            "n": len(kept),
        },
        "sub_rewards": {k: float(np.mean(v)) for k, v in sorted(subs.items())},
        "grader_errors": dict(errors),
        "groups": len(groups),
        "zero_signal_groups": sum(1 for rs in flat if len(rs) < 2 or max(rs) - min(rs) <= 1e-9),
        "reward_histogram": np.histogram(
            kept, bins=10, range=(min(kept + [0.0]), max(kept + [1.0]))
        )[0].tolist()
        if kept
        else [],
    }
    if pass_threshold is not None:
        out["pass_rate"] = float(np.mean([r >= pass_threshold for r in kept])) if kept else math.nan
        out["pass_threshold"] = pass_threshold
    return out


def eval_results(groups: Sequence[Group], pass_threshold: float | None = None) -> dict[str, Any]:
    """Everything `agentrft eval` reports: rewards, tool use, tokens, latency, stop reasons."""
    trajs = [t for g in groups for t in g.trajectories]
    res = {**reward_stats(groups, pass_threshold), **summarize(trajs)}
    res["discard_rate"] = res["discarded"] / max(1, res["rollouts"])
    res["grader_error_rate"] = sum(res["grader_errors"].values()) / max(1, res["rollouts"])
    kept = [t for t in trajs if t.discarded is None]
    res["tool_output_tokens"] = distribution([t.count(Origin.TOOL_OUTPUT) for t in kept])
    res["tool_call_tokens"] = distribution([tool_call_tokens(t) for t in kept])
    res["tool_argument_chars"] = distribution(
        [sum(len(c.arguments) for c in t.tool_calls) for t in kept]
    )
    return res


def tool_call_tokens(traj: Trajectory) -> int:
    """Tokens the model wrote in the replies that call tools (the calls and their arguments;
    a prefilled start is not the model's): what it sends to tools, per rollout."""
    return sum(turn.sampled_tokens for turn in traj.turns if turn.tool_calls)


def graded_records(groups: Sequence[Group], **extra: Any) -> list[dict[str, Any]]:
    return [
        to_record(t, gr, extra or None)
        for g in groups
        for t, gr in zip(g.trajectories, g.grades, strict=True)
    ]
