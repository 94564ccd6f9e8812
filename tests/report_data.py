"""Inputs for the report tests, in the shapes runs write to disk: metrics rows, rollout
records made by `to_record` from real Trajectory objects, an eval summary as JSON."""

from __future__ import annotations

import json
import random
from typing import Any

from agentrft.rollout.records import summarize, to_record
from agentrft.types import Grade, Group, Item, StopReason, ToolCall, ToolResult, Trajectory, Turn

NASTY = "<script>alert('x')</script> & <b>not bold</b>"


def trajectory(row: int, n_calls: int, rng: random.Random) -> Trajectory:
    item = Item(
        row,
        ({"role": "user", "content": f"Question {row}?"},),
        {"answer": "42"},
        f"val.jsonl:{row + 1}",
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": "Example?"},
        {"role": "assistant", "content": "Example answer."},
        {"role": "user", "content": f"Question {row}?"},
    ]
    turns = []
    for i in range(n_calls):
        call = ToolCall(f"fc_{row}{i}", f"call_{row}{i}", "search", json.dumps({"q": f"q{i}"}))
        result = ToolResult(
            call.call_id, "search", NASTY if i == 0 else f"result {i}", "ok", 0.01, 1, 80
        )
        text = f'<tool_call>{{"name": "search", "arguments": {call.arguments}}}</tool_call>'
        turns.append(Turn(i, text, 20, (call,), (result,), 0.2, 0.01))
        messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "search", "arguments": call.arguments},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call.call_id,
                "name": "search",
                "content": result.output,
            }
        )
    turns.append(Turn(n_calls, "The answer is 42.", 6, (), (), 0.1))
    messages.append({"role": "assistant", "content": "The answer is 42."})
    return Trajectory(
        f"trace_{row}_{rng.random():.6f}",
        item,
        tuple(messages),
        tuple(turns),
        (),
        (),
        (),
        StopReason.FINAL_ANSWER,
        timings={"total_s": 0.5 + n_calls * 0.2},
    )


def eval_records(
    seed: int, calls_mean: int, reward_p: float, rows: int = 6, samples: int = 4
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for row in range(rows):
        for _ in range(samples):
            traj = trajectory(row, max(0, calls_mean + rng.randint(-1, 2)), rng)
            out.append(to_record(traj, Grade(float(rng.random() < reward_p))))
    return out


def graded_groups(
    seed: int, calls_mean: int, reward_p: float, rows: int = 4, samples: int = 3
) -> list[Group]:
    """Groups of graded trajectories, as `agentrft eval` holds them before writing."""
    rng = random.Random(seed)
    groups = []
    for row in range(rows):
        trajs = tuple(
            trajectory(row, max(0, calls_mean + rng.randint(-1, 1)), rng) for _ in range(samples)
        )
        groups.append(
            Group(trajs[0].item, trajs, tuple(Grade(float(rng.random() < reward_p)) for _ in trajs))
        )
    return groups


def metrics_rows(steps: int = 12) -> list[dict[str, Any]]:
    return [
        {
            "step": s,
            "reward/mean": 0.2 + 0.05 * s,
            "eval/reward/mean": 0.15 + 0.05 * s,
            "loss": 1.0 / (s + 1),
            "rollouts/discarded": 0,
        }
        for s in range(steps)
    ]


def summary_only(records: list[dict[str, Any]]) -> dict[str, Any]:
    """An eval result holding only a summary, after a JSON round trip (int keys -> str)."""
    del records
    rng = random.Random(3)
    trajs = [trajectory(r, rng.randint(0, 3), rng) for r in range(5)]
    return json.loads(
        json.dumps({"summary": summarize(trajs), "best_of_k": {"1": 0.3, "2": 0.45, "4": 0.6}})
    )
