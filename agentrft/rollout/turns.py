"""What every episode driver does with a reply once it is text: apply the stop rules, run
its tool calls concurrently, and record the turn.

`episode.py` drives a local policy token by token (trainable); `chat_episode.py` drives an
OpenAI-compatible endpoint message by message (evaluation only). Both end with the same
stop reasons and the same `Trajectory` record because both go through `finish_turn`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrft.errors import ToolUnavailable
from agentrft.tools import Tool
from agentrft.types import Item, StopReason, ToolCall, ToolResult, Trajectory, Turn


def new_trace_id() -> str:
    return f"trace_{uuid.uuid4()}"


def assistant_message(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """The reply as the model wrote it, with its valid calls also in OpenAI's `tool_calls`."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    valid = [c for c in calls if c.error is None]
    if valid:
        msg["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in valid
        ]
    return msg


def tool_messages(results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    return [
        {"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.output}
        for r in results
    ]


async def run_call(
    call: ToolCall,
    tools: Mapping[str, Tool],
    trace_id: str,
    item: Mapping[str, Any],
    client: httpx.AsyncClient,
) -> ToolResult:
    """Execute one call; a call that did not parse is answered with its error instead."""
    if call.error is not None:
        return ToolResult(call.call_id, call.name, f"Error: {call.error}", "invalid_call")
    return await tools[call.name](call, trace_id, item, client)


@dataclass(frozen=True)
class StopRules:
    max_episode_steps: int | None = None  # replies per rollout
    max_tool_calls: int | None = None  # a rollout stops once it asks for more than this
    end_when: str | None = None  # a rollout ends once a tool's output contains this text


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings:
    """What every episode driver needs besides its model: the tools and the limits. The
    token-level driver's `RolloutSettings` and the chat driver's `ChatRolloutSettings` add
    their own fields to these (`agentrft.runtime.episode_fields` fills them from a job).
    Picklable."""

    tools: Mapping[str, Tool]
    max_tokens_per_turn: int = 256
    max_tokens_per_episode: int = 1024  # sampled tokens over all turns
    max_episode_steps: int | None = None  # replies per rollout
    max_tool_calls: int | None = None  # a rollout stops once it asks for more than this
    prefill_all_turns: bool = False  # repeat the first prefill on every reply
    prefill_until: str | None = None  # no prefill once a tool's output contains this text
    end_when: str | None = None  # the rollout ends once a tool's output contains this text

    def prefill_ended(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """True once a tool's output in `messages` contains `prefill_until` (say, the
        environment's "the tests pass"): from then on the replies are the model's own, so a
        solved task is not made to call again."""
        until = self.prefill_until
        return until is not None and any(
            m.get("role") == "tool" and until in str(m.get("content") or "") for m in messages
        )

    @property
    def schemas(self) -> dict[str, Any]:
        return {name: tool.spec.parameters for name, tool in self.tools.items()}

    @property
    def rules(self) -> StopRules:
        return StopRules(self.max_episode_steps, self.max_tool_calls, self.end_when)


@dataclass
class EpisodeLog:
    """The growing record of one rollout, shared by the drivers."""

    item: Item
    messages: list[dict[str, Any]]
    trace_id: str = field(default_factory=new_trace_id)
    turns: list[Turn] = field(default_factory=list)
    n_calls: int = 0
    discarded: str | None = None
    timings: dict[str, float] = field(default_factory=lambda: {"sample_s": 0.0, "tools_s": 0.0})
    t_start: float = field(default_factory=time.perf_counter)

    def record(self, turn: Turn, assistant: dict[str, Any]) -> None:
        self.turns.append(turn)
        self.messages.append(assistant)

    def trajectory(
        self,
        stop: StopReason,
        tokens: Sequence[int] = (),
        origins: Sequence[int] = (),
        logprobs: Sequence[float] = (),
    ) -> Trajectory:
        self.timings["total_s"] = time.perf_counter() - self.t_start
        return Trajectory(
            trace_id=self.trace_id,
            item=self.item,
            messages=tuple(self.messages),
            turns=tuple(self.turns),
            tokens=tuple(tokens),
            origins=tuple(origins),
            logprobs=tuple(logprobs),
            stop_reason=stop,
            discarded=self.discarded,
            timings=self.timings,
        )


async def finish_turn(
    log: EpisodeLog,
    text: str,
    calls: tuple[ToolCall, ...],
    *,
    ended: bool,
    sampled_tokens: int,
    sample_s: float,
    assistant: Callable[[tuple[ToolCall, ...]], dict[str, Any]],
    rules: StopRules,
    tools: Mapping[str, Tool],
    client: httpx.AsyncClient,
    cut_off: StopReason = StopReason.MAX_TOKENS,
) -> tuple[StopReason | None, list[dict[str, Any]]]:
    """Record one reply and act on it. `ended` is False when the reply was cut off (its
    calls are then not run, and `cut_off` is the stop reason); `assistant(calls)` builds the
    message that records the reply. Returns the stop reason, or None to continue, and the
    tool messages appended after the reply (empty unless its calls ran)."""
    log.timings["sample_s"] += sample_s
    index = len(log.turns)
    if not ended:
        log.record(Turn(index, text, sampled_tokens, (), (), sample_s), assistant(()))
        return cut_off, []
    if not calls:
        log.record(Turn(index, text, sampled_tokens, (), (), sample_s), assistant(()))
        return StopReason.FINAL_ANSWER, []
    log.n_calls += len(calls)
    if rules.max_tool_calls is not None and log.n_calls > rules.max_tool_calls:
        log.record(Turn(index, text, sampled_tokens, calls, (), sample_s), assistant(calls))
        return StopReason.MAX_TOOL_CALLS, []
    t0 = time.perf_counter()
    try:
        results = await asyncio.gather(
            *(run_call(c, tools, log.trace_id, log.item.fields, client) for c in calls)
        )
    except ToolUnavailable as exc:
        log.record(
            Turn(index, text, sampled_tokens, calls, (), sample_s, time.perf_counter() - t0),
            assistant(calls),
        )
        log.discarded = str(exc)
        return StopReason.TOOL_ERROR, []
    tools_s = time.perf_counter() - t0
    log.timings["tools_s"] += tools_s
    log.record(
        Turn(index, text, sampled_tokens, calls, tuple(results), sample_s, tools_s),
        assistant(calls),
    )
    answers = tool_messages(results)
    log.messages.extend(answers)
    if rules.end_when is not None and any(
        r.status == "ok" and rules.end_when in r.output for r in results
    ):
        # the environment says the task is over (say, "the tests pass"): a reply after it
        # could only be a wasted call or words nobody grades. Errors do not count (they may
        # echo the model's own arguments), and ending is no more than the model could do by
        # answering, so a tool made to echo the text gains nothing.
        return StopReason.ENDED_BY_TOOL, answers
    if rules.max_episode_steps is not None and len(log.turns) >= rules.max_episode_steps:
        return (
            StopReason.MAX_EPISODE_STEPS,
            answers,
        )  # the last calls ran (they may change state a grader checks)
    return None, answers
