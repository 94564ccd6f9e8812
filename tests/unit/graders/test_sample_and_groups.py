"""The sample namespace built from a trajectory, and grading whole groups concurrently."""

from __future__ import annotations

import asyncio
import json
import math

from agentrft.graders import build_grader, grade_groups, sample_from_text, sample_from_trajectory
from agentrft.types import Group, StopReason

from .conftest import make_trajectory


def test_sample_from_trajectory_shape() -> None:
    traj = make_trajectory(
        '{"answer": 42} ', [[("grep", {"q": "x"}), ("read", {"path": "a.py"})]], fields={"k": 1}
    )
    s = sample_from_trajectory(traj)
    assert s["output_text"] == '{"answer": 42}'
    assert s["output_json"] == {"answer": 42}
    assert s["output_tools"] == []  # the final reply made no call
    assert s["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": '{"answer": 42}', "tool_calls": None},
            "finish_reason": "stop",
        }
    ]
    assert [(c["name"], c["arguments"], c["output"], c["status"]) for c in s["tool_calls"]] == [
        ("grep", {"q": "x"}, "out:grep", "ok"),
        ("read", {"path": "a.py"}, "out:read", "ok"),
    ]
    roles = [m["role"] for m in s["trajectory"]]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    assert s["trajectory"][1]["tool_calls"][0]["function"]["name"] == "grep"
    assert s["stop_reason"] == "final_answer"
    json.dumps(s)  # JSON-safe: it goes to sandboxes and over HTTP


def test_final_reply_with_tool_calls_strips_blocks_and_fills_output_tools() -> None:
    traj = make_trajectory(
        "Let me look.", final_calls=[("grep", {"q": "y"})], stop=StopReason.MAX_EPISODE_STEPS
    )
    s = sample_from_trajectory(traj)
    assert s["output_text"] == "Let me look."
    assert s["output_json"] is None
    assert s["output_tools"][0]["function"] == {"name": "grep", "arguments": '{"q": "y"}'}
    assert s["choices"][0]["finish_reason"] == "tool_calls"
    assert s["tool_calls"][0]["status"] == "not_run"


def test_sample_from_text() -> None:
    s = sample_from_text("[1, 2]")
    assert s["output_json"] == [1, 2]
    assert s["tool_calls"] == [] and s["output_tools"] == []


def test_grade_groups_fills_grades_in_order_and_skips_discarded() -> None:
    grader = build_grader(
        {
            "type": "string_check",
            "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}",
            "operation": "eq",
        }
    )
    g1 = [
        make_trajectory("yes", fields={"answer": "yes"}),
        make_trajectory("no", fields={"answer": "yes"}),
        make_trajectory("yes", fields={"answer": "yes"}, discarded="tool down"),
    ]
    g2 = [make_trajectory("b", fields={"answer": "b"}), make_trajectory("b", fields={})]
    groups = [Group(g1[0].item, tuple(g1)), Group(g2[0].item, tuple(g2))]
    seen: list[object] = []
    out = asyncio.run(
        grade_groups(groups, grader, concurrency=2, on_graded=lambda t, g: seen.append(g))
    )
    assert [g.score if g else None for g in out[0].grades] == [1.0, 0.0, None]
    assert out[1].grades[0].score == 1.0
    assert out[1].grades[1].error == "invalid_variable_error" and math.isnan(out[1].grades[1].score)
    assert out[0].trajectories == groups[0].trajectories
    assert len(seen) == 5


def test_grade_groups_shares_one_http_client_and_sends_each_trace_id(recorder) -> None:
    rec, url = recorder([(200, {"score": 0.5})])
    grader = build_grader({"type": "endpoint", "url": f"{url}/grade"})
    trajs = tuple(make_trajectory("x", trace_id=f"trace_{i}") for i in range(4))
    out = asyncio.run(grade_groups([Group(trajs[0].item, trajs)], grader))
    assert [g.score for g in out[0].grades] == [0.5] * 4
    assert sorted(r["body"]["trace_id"] for r in rec.requests) == [f"trace_{i}" for i in range(4)]
