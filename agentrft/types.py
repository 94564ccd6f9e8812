"""The vocabulary every stage speaks: dataset -> rollout -> grade -> advantages -> update.

Frozen dataclasses and enums only; no behaviour beyond derived views. A `Trajectory` is the
whole record of one rollout, token by token, and is what graders, the trainer and the
reports read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class StopReason(enum.StrEnum):
    """Why a rollout ended."""

    FINAL_ANSWER = "final_answer"  # the model replied without a tool call
    MAX_EPISODE_STEPS = "max_episode_steps"  # turn limit reached while still calling tools
    MAX_TOOL_CALLS = "max_tool_calls"  # the tool-call budget was exceeded
    MAX_TOKENS = "max_tokens"  # a reply hit its token limit before ending
    CONTEXT_OVERFLOW = "context_overflow"  # no room left in the context window
    TOOL_ERROR = "tool_error"  # a tool stayed unavailable after retries: rollout discarded
    ENDED_BY_TOOL = "ended_by_tool"  # a tool's output had the job's `end_when` text (task over)


class Origin(enum.IntEnum):
    """Where a token of the context came from. Only SAMPLED tokens are trainable."""

    PROMPT = 0  # system prompt, few-shot examples, the row's messages
    TEMPLATE = 1  # chat-template glue between turns (role headers, end markers)
    TOOL_OUTPUT = 2  # text returned by a tool (or a parse error shown to the model)
    PREFILL = 3  # the job's fixed start of each reply, inserted, not sampled
    SAMPLED = 4  # chosen by the policy
    FORCED = 5  # sampled, but the only token the tool-call grammar allowed: no choice, not trained


@dataclass(frozen=True)
class Item:
    """One dataset row. `fields` is the OpenAI "item": every key except `messages`."""

    index: int
    messages: tuple[Mapping[str, Any], ...]
    fields: Mapping[str, Any]
    source: str  # "file.jsonl:LINE", for error messages and reports
    prefill: str | None = None  # per-row override of the job's prefill


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote. `error` set means it was not executed (parse/validation)."""

    id: str  # "fc_..."
    call_id: str  # "call_..."
    name: str
    arguments: str  # JSON string, as sent on the wire
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What came back for one call, and what the model was shown."""

    call_id: str
    name: str
    output: str  # exactly the text the model sees
    status: str  # ok | client_error | invalid_call | refused | unavailable
    latency_s: float = 0.0
    attempts: int = 0
    request_bytes: int = 0


@dataclass(frozen=True)
class Turn:
    """One assistant reply and the tool results that answered it."""

    index: int
    text: str  # the reply as the model wrote it, prefill included
    sampled_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    sample_s: float = 0.0
    tools_s: float = 0.0


@dataclass(frozen=True)
class Trajectory:
    """The full, token-in/token-out record of one rollout.

    `tokens`, `origins` and `logprobs` are aligned: the exact context the model saw, where
    each token came from, and for SAMPLED tokens the log-probability it was sampled with
    (0.0 elsewhere).
    """

    trace_id: str
    item: Item
    messages: tuple[Mapping[str, Any], ...]
    turns: tuple[Turn, ...]
    tokens: tuple[int, ...]
    origins: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: StopReason
    discarded: str | None = None  # reason it stays out of training statistics
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for t in self.turns for c in t.tool_calls)

    @property
    def tool_results(self) -> tuple[ToolResult, ...]:
        return tuple(r for t in self.turns for r in t.tool_results)

    @property
    def sampled_tokens(self) -> int:
        """Tokens the model wrote, over all turns (also known when `tokens` is not, as for
        rollouts against a chat endpoint)."""
        return sum(t.sampled_tokens for t in self.turns)

    @property
    def final_text(self) -> str:
        """The last reply's text (the answer, when stop_reason is FINAL_ANSWER)."""
        return self.turns[-1].text if self.turns else ""

    def count(self, origin: Origin) -> int:
        return sum(1 for o in self.origins if o == origin)


@dataclass(frozen=True)
class Grade:
    """A grader's verdict. `error` is a flag such as `python_grader_runtime_error`: a graded
    sample with an error is discarded from training statistics, never scored 0."""

    score: float
    sub_scores: Mapping[str, float] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Group:
    """The G rollouts of one row, with their grades once graded."""

    item: Item
    trajectories: tuple[Trajectory, ...]
    grades: tuple[Grade | None, ...] = ()


@dataclass(frozen=True)
class FunctionSpec:
    """A tool as a chat request names it: what rendering needs, with no backend to call."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
