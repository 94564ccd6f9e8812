"""Rows -> **rollouts**: G rollouts per row, all concurrently, sharing one batched sampler and
one HTTP pool. Their settings come from the job (`agentrft.runtime`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrft.memory import peak_rss_mb, release_free_memory, reset_peak_rss
from agentrft.policy import Policy, SamplingParams
from agentrft.rollout.batching import BatchedSampler, Sampler
from agentrft.rollout.caller_thread import run_with_caller
from agentrft.rollout.episode import RolloutSettings, run_episode
from agentrft.tools.http import new_client
from agentrft.types import Group, Item, Trajectory


async def run_groups_async(
    items: Sequence[Item],
    group_size: int,
    settings: RolloutSettings,
    sampler: Sampler,
    on_done: Callable[[Trajectory], Any] | None = None,
    first: int = 0,
) -> list[Group]:
    """Every rollout of every row at once; generation is batched across all of them. With a
    seed in the sampler's params, rollout k of the call gets its own derived seed, so results
    do not depend on how requests happened to be batched. `first`: the index of this call's
    first rollout in its step (a step split among workers keeps the seeds of one call)."""
    base = sampler.params.seed
    async with new_client() as client:

        async def one(item: Item, k: int) -> Trajectory:
            seed = None if base is None else base * 1_000_003 + k * 104_729
            traj = await run_episode(item, settings, sampler, client, seed=seed)
            if on_done is not None:
                on_done(traj)
            return traj

        try:
            trajs = await asyncio.gather(
                *(
                    one(item, first + i * group_size + j)
                    for i, item in enumerate(items)
                    for j in range(group_size)
                )
            )
        finally:
            await sampler.aclose()
    return [
        Group(item, tuple(trajs[i * group_size : (i + 1) * group_size]))
        for i, item in enumerate(items)
    ]


def rollout_groups(
    items: Sequence[Item],
    group_size: int,
    settings: RolloutSettings,
    sampler: Sampler,
    on_done: Callable[[Trajectory], Any] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """The rollouts stage of training and evaluation: `group_size` rollouts per row, and the
    phase's wall time and peak memory. The model samples on this thread, the one that loaded
    it and runs the update (`caller_thread` says why); the episodes run beside it. Freed heap
    memory goes back to the OS afterwards (the sampling peak would otherwise stay resident
    through grading and the update)."""
    reset_peak_rss()
    t0 = time.perf_counter()
    groups = run_with_caller(run_groups_async(items, group_size, settings, sampler, on_done))
    stats = {"time/sampling_s": time.perf_counter() - t0, "memory/sampling_peak_mb": peak_rss_mb()}
    release_free_memory()
    return groups, stats


def run_groups(
    items: Sequence[Item],
    group_size: int,
    settings: RolloutSettings,
    policy: Policy,
    params: SamplingParams,
    on_done: Callable[[Trajectory], Any] | None = None,
    max_batch: int = 32,
) -> list[Group]:
    sampler = BatchedSampler(policy, params, max_batch=max_batch)
    return run_with_caller(run_groups_async(items, group_size, settings, sampler, on_done))
