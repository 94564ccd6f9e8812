"""Run G rollouts per row, all concurrently, sharing one batched sampler and one HTTP pool."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentrft.job import Job
from agentrft.policy import Policy, SamplingParams
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings, run_episode
from agentrft.tools import Tool, build_tools
from agentrft.tools.http import new_client
from agentrft.types import Group, Item, Trajectory


def tools_from_job(job: Job, base_url: str | None = None) -> dict[str, Tool]:
    """The job's tools, with its retry settings; bare-path URLs resolve against `base_url`."""
    ext = job.agentrft
    return build_tools(
        job.rl.tools, timeout_s=ext.tool_timeout_s, retries=ext.tool_retries, backoff_s=ext.tool_backoff_s,
        base_url=base_url, base_dir=str(job.resolve_path(".")),
    )


def settings_from_job(job: Job, policy: Policy, base_url: str | None = None) -> RolloutSettings:
    ext = job.agentrft
    tools = tools_from_job(job, base_url)
    renderer = ChatRenderer(policy.tokenizer, job.rl.tools, ext.system_prompt, ext.few_shot_messages)
    return RolloutSettings(
        renderer=renderer,
        tools=tools,
        max_tokens_per_turn=ext.sampling.max_tokens_per_turn,
        max_tokens_per_episode=ext.sampling.max_tokens_per_episode,
        context_window=min(ext.sampling.context_window or policy.context_window, policy.context_window),
        max_episode_steps=job.rl.max_episode_steps,
        max_tool_calls=ext.max_tool_calls,
        prefills=ext.prefills,
        prefill_all_turns=ext.prefill_turns == "all",
    )


def sampling_params(job: Job, seed: int | None = None, temperature: float | None = None) -> SamplingParams:
    s = job.agentrft.sampling
    return SamplingParams(
        temperature=s.temperature if temperature is None else temperature,
        top_p=s.top_p, max_tokens=s.max_tokens_per_turn, seed=job.seed if seed is None else seed, stop=tuple(s.stop),
        min_tokens=s.min_tokens_per_turn,
    )


async def run_groups_async(
    items: Sequence[Item],
    group_size: int,
    settings: RolloutSettings,
    sampler: BatchedSampler,
    on_done: Callable[[Trajectory], Any] | None = None,
) -> list[Group]:
    """Every rollout of every row at once; generation is batched across all of them. With a
    seed in the sampler's params, rollout k of the call gets its own derived seed, so results
    do not depend on how requests happened to be batched."""
    base = sampler.params.seed
    async with new_client() as client:

        async def one(item: Item, k: int) -> Trajectory:
            seed = None if base is None else base * 1_000_003 + k * 104_729
            traj = await run_episode(item, settings, sampler, client, seed=seed)
            if on_done is not None:
                on_done(traj)
            return traj

        try:
            trajs = await asyncio.gather(*(one(item, i * group_size + j) for i, item in enumerate(items) for j in range(group_size)))
        finally:
            await sampler.aclose()
    return [Group(item, tuple(trajs[i * group_size:(i + 1) * group_size])) for i, item in enumerate(items)]


def run_groups(items: Sequence[Item], group_size: int, settings: RolloutSettings, policy: Policy, params: SamplingParams, on_done: Callable[[Trajectory], Any] | None = None, max_batch: int = 32) -> list[Group]:
    sampler = BatchedSampler(policy, params, max_batch=max_batch)
    return asyncio.run(run_groups_async(items, group_size, settings, sampler, on_done))
