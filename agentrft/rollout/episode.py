"""One rollout: a single-use episode that mints a trace_id, alternates model replies and
tool calls, and always ends with a recorded stop reason.

    prompt -> [prefill] -> sample -> parse -> (final answer | run tools concurrently -> append) -> ...

Failures are data: an unparsable call becomes a tool message saying what was wrong; a tool
that stays unavailable ends the rollout as discarded (kept out of training statistics).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agentrft.errors import ToolUnavailable
from agentrft.policy.tool_format import parse_reply
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.context import ChatRenderer
from agentrft.tools import Tool
from agentrft.types import Item, Origin, StopReason, ToolCall, ToolResult, Trajectory, Turn


@dataclass(frozen=True)
class RolloutSettings:
    """Everything an episode needs besides the policy. Picklable."""

    renderer: ChatRenderer
    tools: Mapping[str, Tool]
    max_tokens_per_turn: int = 256
    max_tokens_per_episode: int = 1024
    context_window: int = 2048
    max_episode_steps: int | None = None  # replies per rollout
    max_tool_calls: int | None = None  # a rollout stops once it asks for more than this
    prefill: str | None = None
    prefill_all_turns: bool = False  # default: only the first reply is prefilled

    @property
    def schemas(self) -> dict[str, Any]:
        return {name: tool.spec.parameters for name, tool in self.tools.items()}


def new_trace_id() -> str:
    return f"trace_{uuid.uuid4()}"


def _assistant_message(text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    valid = [c for c in calls if c.error is None]
    if valid:
        msg["tool_calls"] = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in valid]
    return msg


async def _run_call(call: ToolCall, tools: Mapping[str, Tool], trace_id: str, item: Mapping[str, Any], client: httpx.AsyncClient) -> ToolResult:
    if call.error is not None:
        return ToolResult(call.call_id, call.name, f"Error: {call.error}", "invalid_call")
    return await tools[call.name](call, trace_id, item, client)


async def run_episode(item: Item, settings: RolloutSettings, sampler: BatchedSampler, client: httpx.AsyncClient, trace_id: str | None = None, seed: int | None = None) -> Trajectory:
    """Run one rollout to its end. `seed` makes its samples reproducible whatever else is
    batched with them (each reply draws from `seed + turn`)."""
    trace_id = trace_id or new_trace_id()
    renderer, tok = settings.renderer, settings.renderer.tokenizer
    messages, ctx = renderer.initial(item)
    first_prefill = item.prefill if item.prefill is not None else settings.prefill
    first_ids = renderer.prefill_tokens(first_prefill) if first_prefill else []
    turns: list[Turn] = []
    sampled_total, n_calls = 0, 0
    discarded: str | None = None
    t_start = time.perf_counter()
    timings = {"sample_s": 0.0, "tools_s": 0.0}
    stop: StopReason

    while True:
        prefill, prefill_ids = (first_prefill, first_ids) if not turns or settings.prefill_all_turns else (None, [])
        if prefill_ids:
            ctx.insert(prefill_ids, [Origin.PREFILL] * len(prefill_ids))
        room = settings.context_window - len(ctx)
        budget = settings.max_tokens_per_episode - sampled_total
        if room < 1:
            stop = StopReason.CONTEXT_OVERFLOW
            break
        if budget < 1:
            stop = StopReason.MAX_TOKENS
            break
        max_new = min(settings.max_tokens_per_turn, room, budget)
        t0 = time.perf_counter()
        completion = await sampler.sample(list(ctx.tokens), max_new, None if seed is None else seed + 7919 * len(turns))
        sample_s = time.perf_counter() - t0
        timings["sample_s"] += sample_s
        ctx.sampled(completion.tokens, completion.logprobs)
        sampled_total += len(completion.tokens)
        ended = completion.finish_reason == "stop"
        body = completion.tokens[:-1] if completion.ended_by_stop_token else completion.tokens
        text = (prefill or "") + tok.decode(list(body), skip_special_tokens=False)
        parsed = parse_reply(text, settings.schemas)
        if not ended:  # the reply was cut off: its calls (if any) are not run
            turns.append(Turn(len(turns), text, len(completion.tokens), (), (), sample_s))
            messages.append(_assistant_message(text, ()))
            stop = StopReason.CONTEXT_OVERFLOW if len(ctx) >= settings.context_window else StopReason.MAX_TOKENS
            break
        if parsed.is_final:
            turns.append(Turn(len(turns), text, len(completion.tokens), (), (), sample_s))
            messages.append(_assistant_message(text, ()))
            stop = StopReason.FINAL_ANSWER
            break
        n_calls += len(parsed.calls)
        if settings.max_tool_calls is not None and n_calls > settings.max_tool_calls:
            turns.append(Turn(len(turns), text, len(completion.tokens), parsed.calls, (), sample_s))
            messages.append(_assistant_message(text, parsed.calls))
            stop = StopReason.MAX_TOOL_CALLS
            break
        t1 = time.perf_counter()
        try:
            results = await asyncio.gather(*(_run_call(c, settings.tools, trace_id, item.fields, client) for c in parsed.calls))
        except ToolUnavailable as exc:
            turns.append(Turn(len(turns), text, len(completion.tokens), parsed.calls, (), sample_s, time.perf_counter() - t1))
            messages.append(_assistant_message(text, parsed.calls))
            discarded = str(exc)
            stop = StopReason.TOOL_ERROR
            break
        tools_s = time.perf_counter() - t1
        timings["tools_s"] += tools_s
        turns.append(Turn(len(turns), text, len(completion.tokens), parsed.calls, tuple(results), sample_s, tools_s))
        assistant = _assistant_message(text, parsed.calls)
        tool_msgs = [{"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.output} for r in results]
        stop_text = tok.decode([completion.tokens[-1]], skip_special_tokens=False) if completion.ended_by_stop_token else ""
        glue, origins = renderer.continuation([*messages, assistant], tool_msgs, stop_text)
        messages.append(assistant)
        messages.extend(tool_msgs)
        if settings.max_episode_steps is not None and len(turns) >= settings.max_episode_steps:
            stop = StopReason.MAX_EPISODE_STEPS  # the last calls ran (they may change state a grader checks)
            break
        ctx.insert(glue, origins)

    timings["total_s"] = time.perf_counter() - t_start
    return Trajectory(
        trace_id=trace_id, item=item, messages=tuple(messages), turns=tuple(turns),
        tokens=tuple(ctx.tokens), origins=tuple(ctx.origins), logprobs=tuple(ctx.logprobs),
        stop_reason=stop, discarded=discarded, timings=timings,
    )

