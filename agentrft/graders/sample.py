"""The `sample` namespace graders see: what one rollout produced, in OpenAI's shape plus
agentrft's whole-trajectory view.

    output_text   the final reply's text, <tool_call> blocks removed
    output_json   output_text parsed as JSON, or None
    output_tools  the final reply's tool calls, OpenAI chat format
    choices       [{"index": 0, "message": {...}, "finish_reason": ...}]
    trajectory    every message of the rollout, tool calls and tool outputs included (agentrft)
    tool_calls    every call of the rollout: {name, arguments, output, status, ...} (agentrft)
    stop_reason   why the rollout ended (agentrft)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentrft.policy.tool_format import parse_reply
from agentrft.types import StopReason, ToolCall, Trajectory


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _openai_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.call_id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in calls
        if c.error is None
    ]


def _arguments(raw: str) -> dict[str, Any]:
    obj = _json_or_none(raw)
    return obj if isinstance(obj, dict) else {}


def _plain(value: Any) -> Any:
    """A JSON-safe deep copy (messages may hold tuples or mappings)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _sample(text: str, final_calls: Sequence[ToolCall], finish_reason: str) -> dict[str, Any]:
    tools = _openai_calls(final_calls)
    message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": tools or None}
    return {
        "output_text": text,
        "output_json": _json_or_none(text),
        "output_tools": tools,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


_FINISH = {
    StopReason.FINAL_ANSWER: "stop",
    StopReason.MAX_TOKENS: "length",
    StopReason.CONTEXT_OVERFLOW: "length",
}


def sample_from_trajectory(traj: Trajectory) -> dict[str, Any]:
    """The sample namespace for one rollout (JSON-safe, so it can go to a sandbox or over HTTP)."""
    parsed = parse_reply(traj.final_text, {})  # schemas are not needed to strip the call blocks
    last = traj.turns[-1] if traj.turns else None
    final_calls = last.tool_calls if last else ()
    finish = _FINISH.get(traj.stop_reason, "tool_calls" if final_calls else "stop")
    sample = _sample(parsed.text, final_calls, finish)
    results = {r.call_id: r for r in traj.tool_results}
    calls = []
    for c in traj.tool_calls:
        r = results.get(c.call_id)
        calls.append(
            {
                "call_id": c.call_id,
                "name": c.name,
                "arguments": _arguments(c.arguments),
                "output": r.output if r else None,
                "status": r.status if r else ("invalid_call" if c.error else "not_run"),
                "error": c.error,
            }
        )
    sample["trajectory"] = _plain(list(traj.messages))
    sample["tool_calls"] = calls
    sample["stop_reason"] = traj.stop_reason.value
    return sample


def sample_from_text(text: str) -> dict[str, Any]:
    """The sample for a bare model output (OpenAI's grader-run `model_sample`): one assistant
    message, no tool calls."""
    sample = _sample(text, (), "stop")
    sample["trajectory"] = [{"role": "assistant", "content": text}]
    sample["tool_calls"] = []
    sample["stop_reason"] = StopReason.FINAL_ANSWER.value
    return sample
