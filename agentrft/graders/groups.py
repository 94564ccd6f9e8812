"""Grade every rollout of a step, concurrently in one event loop: rollout -> **grade** -> advantages.

Discarded rollouts (a tool stayed down) are not graded: their grade is None. A grade with
`error` set is returned as is; callers keep both kinds out of the group statistics.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from agentrft.graders.protocol import Grader, http_client
from agentrft.graders.sample import sample_from_trajectory
from agentrft.types import Grade, Group, Trajectory


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
                grade = await grader.agrade(sample_from_trajectory(traj), dict(traj.item.fields), traj.trace_id)
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
        out.append(dataclasses.replace(g, grades=tuple(grades[i:i + n])))
        i += n
    return out
