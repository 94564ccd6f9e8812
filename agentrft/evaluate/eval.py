"""Rollout -> grade for a set of rows, and the statistics of the result.

Shared by `agentrft eval` (baseline and trained models), `agentrft preflight` and the
training loop's periodic evaluation: the same numbers mean the same thing everywhere.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentrft.memory import peak_rss_mb, release_free_memory, reset_peak_rss
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import run_groups_async
from agentrft.rollout.records import distribution, summarize, to_record
from agentrft.types import Grade, Group, Origin, Trajectory


def reward_of(grade: Grade | None) -> float:
    """The reward a rollout counts with; NaN when it was discarded or its grader failed."""
    return math.nan if grade is None or grade.error else float(grade.score)


async def cleanup_traces(base_url: str | None, trajs: Sequence[Trajectory]) -> None:
    """Tell an agentrft environment server the rollouts are graded (their per-trace state,
    e.g. a workspace, can go). Servers without /cleanup just answer 404."""
    if base_url is None:
        return
    from agentrft.tools.http import new_client

    async with new_client() as client:
        await asyncio.gather(*(client.post(base_url + "/cleanup", json={"trace_id": t.trace_id}, timeout=30) for t in trajs), return_exceptions=True)


async def grade_and_cleanup(groups: list[Group], grader: Any, env_url: str | None = None) -> list[Group]:
    """Grade every rollout, then release the environment's per-trace state."""
    from agentrft.graders import grade_groups

    graded = await grade_groups(groups, grader)
    await cleanup_traces(env_url, [t for g in graded for t in g.trajectories])
    return graded


async def rollout_and_grade(
    items: Sequence[Any],
    group_size: int,
    settings: RolloutSettings,
    sampler: BatchedSampler,
    grader: Any,
    env_url: str | None = None,
    on_rollout: Callable[[Trajectory], Any] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """Run and grade `group_size` rollouts per row; returns the graded groups and the wall
    time and peak memory of each phase."""
    reset_peak_rss()
    t0 = time.perf_counter()
    groups = await run_groups_async(items, group_size, settings, sampler, on_rollout)
    t1 = time.perf_counter()
    sampling_mb = peak_rss_mb()
    release_free_memory()
    reset_peak_rss()
    groups = await grade_and_cleanup(groups, grader, env_url)
    return groups, {"time/sampling_s": t1 - t0, "time/grading_s": time.perf_counter() - t1,
                    "memory/sampling_peak_mb": sampling_mb, "memory/grading_peak_mb": peak_rss_mb()}


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
        "reward": {"mean": float(np.mean(kept)) if kept else math.nan, "std": float(np.std(kept)) if kept else math.nan, "n": len(kept)},
        "sub_rewards": {k: float(np.mean(v)) for k, v in sorted(subs.items())},
        "grader_errors": dict(errors),
        "groups": len(groups),
        "zero_signal_groups": sum(1 for rs in flat if len(rs) < 2 or max(rs) - min(rs) <= 1e-9),
        "reward_histogram": np.histogram(kept, bins=10, range=(min(kept + [0.0]), max(kept + [1.0])))[0].tolist() if kept else [],
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
    res["tool_output_tokens"] = distribution([t.count(Origin.TOOL_OUTPUT) for t in trajs if t.discarded is None])
    return res


def graded_records(groups: Sequence[Group], **extra: Any) -> list[dict[str, Any]]:
    return [to_record(t, gr, extra or None) for g in groups for t, gr in zip(g.trajectories, g.grades, strict=True)]
