"""Grade every rollout of a step, concurrently in one event loop: rollout -> **grade** -> advantages.

Discarded rollouts (a tool stayed down) are not graded: their grade is None. A grade with
`error` set is returned as is; `reward_of` turns both kinds into NaN, which keeps them out
of the group statistics everywhere (training, evaluation, pre-flight).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrft.graders.protocol import Grader, http_client
from agentrft.graders.sample import sample_from_trajectory
from agentrft.memory import peak_rss_mb, reset_peak_rss
from agentrft.types import Grade, Group, Trajectory


def reward_of(grade: Grade | None) -> float:
    """The reward a rollout counts with; NaN when it was discarded or its grader failed."""
    return math.nan if grade is None or grade.error else float(grade.score)


async def grade_groups(
    groups: Sequence[Group],
    grader: Grader,
    concurrency: int = 32,
    on_graded: Callable[[Trajectory, Grade | None], Any] | None = None,
) -> list[Group]:
    """The same groups with `grades` filled, one per trajectory and in the same order.
    At most `concurrency` grades run at once; HTTP graders share one pooled client."""
    from agentrft.tools.http import new_client

    sem = asyncio.Semaphore(concurrency)

    async def one(traj: Trajectory) -> Grade | None:
        grade = None
        if traj.discarded is None:
            async with sem:
                grade = await grader.agrade(
                    sample_from_trajectory(traj), dict(traj.item.fields), traj.trace_id
                )
        if on_graded is not None:
            on_graded(traj, grade)
        return grade

    async with new_client(max_connections=concurrency) as client:
        token = http_client.set(client)
        try:
            grades = await asyncio.gather(*(one(t) for g in groups for t in g.trajectories))
        finally:
            http_client.reset(token)
    out, i = [], 0
    for g in groups:
        n = len(g.trajectories)
        out.append(dataclasses.replace(g, grades=tuple(grades[i : i + n])))
        i += n
    return out


async def cleanup_traces(base_url: str | None, trajs: Sequence[Trajectory]) -> None:
    """Tell an agentrft environment server the rollouts are graded (their per-trace state,
    e.g. a workspace, can go). Servers without /cleanup just answer 404."""
    if base_url is None:
        return
    from agentrft.tools.env_token import with_env_token
    from agentrft.tools.http import new_client

    url = base_url + "/cleanup"
    headers = dict(with_env_token(url, {}))
    async with new_client() as client:
        await asyncio.gather(
            *(
                client.post(url, json={"trace_id": t.trace_id}, headers=headers, timeout=30)
                for t in trajs
            ),
            return_exceptions=True,
        )


def grade_rollouts(
    groups: Sequence[Group], grader: Grader, env_url: str | None = None
) -> tuple[list[Group], dict[str, float]]:
    """The grades stage of training and evaluation: grade every rollout, then release the
    environment's per-trace state. Also returns the phase's wall time and peak memory."""

    async def grade_and_release() -> list[Group]:
        graded = await grade_groups(groups, grader)
        await cleanup_traces(env_url, [t for g in graded for t in g.trajectories])
        return graded

    reset_peak_rss()
    t0 = time.perf_counter()
    graded = asyncio.run(grade_and_release())
    return graded, {
        "time/grading_s": time.perf_counter() - t0,
        "memory/grading_peak_mb": peak_rss_mb(),
    }
