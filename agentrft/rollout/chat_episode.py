"""One rollout against an OpenAI-compatible chat endpoint, message by message: to evaluate a
hosted model or one behind `agentrft serve-model`.

Same stop rules, tool execution, trace_id and `Trajectory` record as `episode.py` (both
go through `rollout/turns.py`), except that the endpoint hides tokens: `tokens`,
`origins` and `logprobs` stay empty, so such a trajectory can be graded and reported but
**never trained on**. Sampled-token counts come from the endpoint's `usage`.

Differences a job may notice:
- Tools travel as OpenAI `tools`; the endpoint renders them. Few-shot turns written in
  agentrft's `<tool_call>` format are converted to OpenAI `tool_calls` with matching ids.
- A prefill cannot be sent to a chat endpoint. The one that has an API meaning,
  `<tool_call>`, becomes `tool_choice: "required"`; any other is refused.
- A reply's `tool_calls` are validated against the job's schemas like parsed calls; a
  reply without them is parsed for `<tool_call>` blocks (endpoints without a tool parser,
  and `serve-model` when a call is malformed), and errors go back to the model as tool
  output.
- `context_length_exceeded` from the endpoint ends the rollout as CONTEXT_OVERFLOW. Other
  4xx replies and an endpoint that stays down raise: the run is misconfigured.

The settings come from the job (`agentrft.runtime.chat_settings_from_job`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrft.errors import ConfigError
from agentrft.policy.openai_client import ChatChoice, ChatRequestRejected, OpenAIChat
from agentrft.policy.tool_format import OPEN, parse_call, parse_reply
from agentrft.rollout.context import prompt_messages
from agentrft.rollout.turns import EpisodeLog, EpisodeSettings, finish_turn, new_trace_id
from agentrft.tools import release_tools
from agentrft.tools.http import new_client
from agentrft.types import Group, Item, StopReason, ToolCall, Trajectory

_WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id")


@dataclass(frozen=True, kw_only=True)
class ChatRolloutSettings(EpisodeSettings):
    """Everything a chat episode needs besides the endpoint. Picklable."""

    system_prompt: str | None = None
    few_shot_messages: tuple[Mapping[str, Any], ...] = ()
    prefill: str | None = None  # only "<tool_call>" (sent as tool_choice="required")
    sampling: Mapping[str, Any] = field(default_factory=dict)  # temperature, top_p, seed, stop

    def __post_init__(self) -> None:
        if self.prefill is not None and self.prefill.strip() != OPEN:
            raise ConfigError(
                f"prefill {self.prefill!r} cannot be sent to a chat endpoint; only {OPEN!r} can "
                '(as tool_choice="required"). Evaluate with the local model, or drop the prefill.'
            )
        if self.prefill is not None and not self.tools:
            raise ConfigError(f"prefill {OPEN!r} needs at least one tool")


def openai_history(
    messages: Sequence[Mapping[str, Any]], schemas: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Messages written in agentrft's format (assistant `<tool_call>` blocks, tool messages
    without ids, as few-shot examples are) in OpenAI's: each block becomes a `tool_calls`
    entry and the tool messages after it get its ids, in order."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for m in messages:
        msg = dict(m)
        if (
            msg["role"] == "assistant"
            and not msg.get("tool_calls")
            and OPEN in (msg.get("content") or "")
        ):
            parsed = parse_reply(msg["content"], {name: {} for name in schemas})
            calls = [c for c in parsed.calls if c.error is None]
            if calls:
                msg["content"] = parsed.text or None
                msg["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ]
                pending = [c.call_id for c in calls]
        elif msg["role"] == "tool" and not msg.get("tool_call_id") and pending:
            msg["tool_call_id"] = pending.pop(0)
        out.append(msg)
    return out


def call_from_openai(tool_call: Mapping[str, Any], schemas: Mapping[str, Any]) -> ToolCall:
    """A reply's `tool_calls` entry, validated like a parsed call; keeps the endpoint's id."""
    fn = tool_call.get("function") or {}
    parsed = parse_call(
        json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments", "{}")}), schemas
    )
    return dataclasses.replace(parsed, call_id=str(tool_call.get("id") or parsed.call_id))


def _wire(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: m[k] for k in _WIRE_KEYS if k in m} for m in messages]


def _reply(
    choice: ChatChoice, schemas: Mapping[str, Any]
) -> tuple[str, tuple[ToolCall, ...], Callable[[tuple[ToolCall, ...]], dict[str, Any]]]:
    """(text, calls, assistant-message builder) for one choice."""
    text = choice.content or ""
    if choice.tool_calls:
        return (
            text,
            tuple(call_from_openai(c, schemas) for c in choice.tool_calls),
            lambda _calls: choice.message,
        )
    return (
        text,
        parse_reply(text, schemas).calls,
        lambda _calls: {"role": "assistant", "content": text},
    )


async def run_chat_episode(
    item: Item,
    settings: ChatRolloutSettings,
    chat: OpenAIChat,
    client: httpx.AsyncClient,
    trace_id: str | None = None,
) -> Trajectory:
    """Run one rollout against the endpoint; what its tools held for it is closed after."""
    trace_id = trace_id or new_trace_id()
    try:
        return await _chat_episode(item, settings, chat, client, trace_id)
    finally:
        await release_tools(settings.tools, trace_id)


async def _chat_episode(
    item: Item,
    settings: ChatRolloutSettings,
    chat: OpenAIChat,
    client: httpx.AsyncClient,
    trace_id: str,
) -> Trajectory:
    schemas = settings.schemas
    specs = [tool.spec for tool in settings.tools.values()] or None
    messages = openai_history(
        prompt_messages(item, settings.system_prompt, settings.few_shot_messages), schemas
    )
    log = EpisodeLog(item, messages, trace_id=trace_id)
    sampled_total = 0
    stop: StopReason | None
    while True:
        budget = settings.max_tokens_per_episode - sampled_total
        if budget < 1:
            stop = StopReason.MAX_TOKENS
            break
        prefilled = (
            settings.prefill is not None
            and (not log.turns or settings.prefill_all_turns)
            and not settings.prefill_ended(log.messages)
        )
        t0 = time.perf_counter()
        try:
            (choice,) = await chat.chat(
                _wire(log.messages),
                specs,
                1,
                client=client,
                max_tokens=min(settings.max_tokens_per_turn, budget),
                tool_choice="required" if prefilled else None,
                **settings.sampling,
            )
        except ChatRequestRejected as exc:
            if exc.code != "context_length_exceeded":
                raise
            stop = StopReason.CONTEXT_OVERFLOW
            break
        sample_s = time.perf_counter() - t0
        n_tokens = int(choice.usage.get("completion_tokens", 0))
        sampled_total += n_tokens
        text, calls, assistant = _reply(choice, schemas)
        stop, _ = await finish_turn(
            log,
            text,
            calls,
            ended=choice.finish_reason != "length",
            sampled_tokens=n_tokens,
            sample_s=sample_s,
            assistant=assistant,
            rules=settings.rules,
            tools=settings.tools,
            client=client,
        )
        if stop is not None:
            break
    return log.trajectory(stop)


async def run_chat_groups_async(
    items: Sequence[Item],
    group_size: int,
    settings: ChatRolloutSettings,
    chat: OpenAIChat,
    concurrency: int = 8,
    on_done: Callable[[Trajectory], Any] | None = None,
) -> list[Group]:
    """G rollouts per row against the endpoint, at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    async with new_client() as client:

        async def one(item: Item) -> Trajectory:
            async with gate:
                traj = await run_chat_episode(item, settings, chat, client)
            if on_done is not None:
                on_done(traj)
            return traj

        trajs = await asyncio.gather(*(one(item) for item in items for _ in range(group_size)))
    return [
        Group(item, tuple(trajs[i * group_size : (i + 1) * group_size]))
        for i, item in enumerate(items)
    ]
