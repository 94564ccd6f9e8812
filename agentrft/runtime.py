"""The one place a `Job` becomes runtime settings: the tools and rollout settings (local model
or chat endpoint) and the sampling parameters. The update's and the loss's settings are
train's own (agentrft.train.settings).

Training, evaluation and the CLI all build their settings here, so one job means the same
run everywhere. That includes the tool-call cap: a rollout stops once it asks for more calls
than `agentrft.max_tool_calls` or a `tool_budget` grader allows (`tool_call_cap`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentrft.engine import ServedModel
from agentrft.errors import ConfigError
from agentrft.graders import tool_call_limit
from agentrft.graders.protocol import Grader
from agentrft.job import Job
from agentrft.policy import Policy, SamplingParams
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.chat_episode import ChatRolloutSettings
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings
from agentrft.tools import Tool, build_tools
from agentrft.tools.launch import launch_environment

if TYPE_CHECKING:  # xgrammar loads only where a job constrains its tool calls
    from agentrft.policy.constrain import ToolCallGrammar


def tools_from_job(job: Job, base_url: str | None = None) -> dict[str, Tool]:
    """The job's tools, then its MCP servers' tools, with its retry settings; bare-path URLs
    resolve against `base_url` (the job's environment server)."""
    ext = job.agentrft
    tools = build_tools(
        job.rl.tools,
        timeout_s=ext.tool_timeout_s,
        retries=ext.tool_retries,
        backoff_s=ext.tool_backoff_s,
        base_url=base_url,
        base_dir=str(job.resolve_path(".")),
    )
    if ext.mcp_servers:  # listed now: their schemas are rendered like the job's own tools
        from agentrft.tools.mcp import mcp_tools

        tools.update(
            mcp_tools(
                ext.mcp_servers,
                timeout_s=ext.tool_timeout_s,
                retries=ext.tool_retries,
                backoff_s=ext.tool_backoff_s,
                base_url=base_url,
                base_dir=job.resolve_path("."),
                taken=list(tools),
            )
        )
    return tools


def tool_call_cap(job: Job, grader: Grader | None = None) -> int | None:
    """The most tool calls a rollout may ask for: `agentrft.max_tool_calls`, lowered to the
    smallest `tool_budget` in the grader. A rollout that asks for call N+1 past a budget of
    N stops there: its grade is -1 whatever it does next."""
    caps = [
        c
        for c in (job.agentrft.max_tool_calls, None if grader is None else tool_call_limit(grader))
        if c is not None
    ]
    return min(caps) if caps else None


def settings_from_job(
    job: Job,
    policy: Policy | ServedModel,
    base_url: str | None = None,
    grader: Grader | None = None,
) -> RolloutSettings:
    """Rollout settings for a model sampled token by token (a local policy, or a model a
    vLLM engine serves). Give the `grader` so its tool budget caps calls."""
    ext = job.agentrft
    fields = episode_fields(job, base_url, grader)
    return RolloutSettings(
        renderer=ChatRenderer(
            policy.tokenizer,
            [t.spec for t in fields["tools"].values()],
            ext.system_prompt,
            ext.few_shot_messages,
        ),
        context_window=min(
            ext.sampling.context_window or policy.context_window, policy.context_window
        ),
        prefills=ext.prefills,
        **fields,
    )


def episode_fields(job: Job, base_url: str | None, grader: Grader | None) -> dict[str, Any]:
    """The `EpisodeSettings` fields both drivers share: the tools and the limits."""
    s = job.agentrft.sampling
    return {
        "tools": tools_from_job(job, base_url),
        "max_tokens_per_turn": s.max_tokens_per_turn,
        "max_tokens_per_episode": s.max_tokens_per_episode,
        "max_episode_steps": job.rl.max_episode_steps,
        "max_tool_calls": tool_call_cap(job, grader),
        "prefill_all_turns": job.agentrft.prefill_turns == "all",
        "prefill_until": job.agentrft.prefill_until,
        "end_when": job.agentrft.end_when,
    }


def _one_prefill(prefills: tuple[str, ...]) -> str | None:
    if len(prefills) > 1:
        raise ConfigError(
            'per-reply prefills cannot be sent to a chat endpoint; evaluate with the local model, or use a single "<tool_call>" prefill'
        )
    return prefills[0] if prefills else None


def chat_settings_from_job(
    job: Job,
    base_url: str | None = None,
    grader: Grader | None = None,
    temperature: float | None = None,
) -> ChatRolloutSettings:
    """Rollout settings for an OpenAI-compatible chat endpoint (`base_url`: the job's
    environment server). Give the `grader` so its tool budget caps calls."""
    ext, s = job.agentrft, job.agentrft.sampling
    return ChatRolloutSettings(
        **episode_fields(job, base_url, grader),
        system_prompt=ext.system_prompt,
        few_shot_messages=tuple(ext.few_shot_messages),
        prefill=_one_prefill(ext.prefills),
        # no seed: one seed for every rollout of a row would make an endpoint repeat itself
        # min_tokens: vLLM's extra parameter (sent only when set)
        sampling={
            "temperature": s.temperature if temperature is None else temperature,
            "top_p": s.top_p,
            "stop": list(s.stop) or None,
            "min_tokens": s.min_tokens_per_turn or None,
        },
    )


def sampling_params(
    job: Job, seed: int | None = None, temperature: float | None = None
) -> SamplingParams:
    """The job's sampling parameters (`seed` default: the job's seed)."""
    s = job.agentrft.sampling
    return SamplingParams(
        temperature=s.temperature if temperature is None else temperature,
        top_p=s.top_p,
        max_tokens=s.max_tokens_per_turn,
        seed=job.seed if seed is None else seed,
        stop=tuple(s.stop),
        min_tokens=s.min_tokens_per_turn,
        constraint=tool_call_constraint(job) if s.constrained_tool_calls else None,
    )


def tool_call_constraint(job: Job) -> ToolCallGrammar:
    """The grammar of `agentrft.sampling.constrained_tool_calls`: free text, but each
    `<tool_call>` the policy opens must name a job tool and match its parameters' schema. A
    reply's prefill is read by the grammar first (`ToolCallGrammar.after`), so a prefill may
    open the call and leave only its arguments, or part of them, to the model."""
    from agentrft.policy.constrain import tool_call_grammar

    if not job.rl.tools:
        raise ConfigError("agentrft.sampling.constrained_tool_calls needs tools in the job")
    return tool_call_grammar([(t.name, t.parameters) for t in job.rl.tools], "auto")


def batched_sampler(job: Job, policy: Policy, params: SamplingParams) -> BatchedSampler:
    """The sampler a phase's rollouts share: at most `sampling.max_batch` rows at once, and
    each rollout's KV cache kept between its turns within `sampling.kv_cache_mb`."""
    s = job.agentrft.sampling
    return BatchedSampler(policy, params, max_batch=s.max_batch, kv_cache_mb=s.kv_cache_mb)


@contextlib.contextmanager
def job_environment(job: Job) -> Iterator[str | None]:
    """Start the job's environment server when it names one; yield its base URL (None when
    the job has none: its tools then have full URLs or run in process)."""
    env = job.agentrft.environment
    if env is None:
        yield None
        return
    with launch_environment(
        env.app, job.resolve_path(env.dir), env.host, env.port, env.startup_timeout_s, env.env
    ) as url:
        yield url
