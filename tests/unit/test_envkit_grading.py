"""envkit grading under faults: a trace's state survives a failed /grade, so the retry scores
the real work; a /grade that keeps failing, or that comes after cleanup, is flagged and
never scored 0 on a fresh, empty state."""

from __future__ import annotations

import math
from typing import Any

import httpx

from agentrft.graders import build_grader
from agentrft.tools.envkit import ToolServer, serve_in_thread


def make_env(fail_times: int | None) -> tuple[ToolServer, dict[str, int]]:
    """A server whose tool solves the task; its grader raises `fail_times` times (None:
    always) on solved state, and scores an unsolved (fresh) state 0."""
    env = ToolServer("faulty-grader")
    seen = {"grades": 0, "starts": 0}

    @env.on_start
    def start(ctx: Any) -> None:
        seen["starts"] += 1
        ctx.state["solved"] = False

    @env.tool
    def solve(ctx: Any) -> str:
        ctx.state["solved"] = True
        return "done"

    @env.grader
    def grade(ctx: Any, sample: dict[str, Any], item: dict[str, Any]) -> float:
        seen["grades"] += 1
        if not ctx.state["solved"]:
            return 0.0
        if fail_times is None or seen["grades"] <= fail_times:
            raise RuntimeError("flaky grader")
        return 1.0

    return env, seen


def call_tool(url: str, trace_id: str) -> httpx.Response:
    return httpx.post(
        f"{url}/tools/solve",
        json={
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "solve",
            "arguments": "{}",
            "trace_id": trace_id,
            "item": {},
        },
    )


def endpoint_grader(url: str) -> Any:
    return build_grader(
        {"type": "endpoint", "name": "env", "url": f"{url}/grade", "retries": 3, "backoff_s": 0.0}
    )


def test_a_grade_that_fails_once_then_succeeds_gives_the_real_score() -> None:
    env, seen = make_env(fail_times=1)
    with serve_in_thread(env.app) as url:
        assert call_tool(url, "trace_a").status_code == 200
        grade = endpoint_grader(url).grade({"output_text": ""}, {}, "trace_a")
    assert grade.error is None, grade.metrics
    assert grade.score == 1.0
    assert seen["starts"] == 1  # the retry graded the same state, not a fresh one
    assert env.active_traces == []  # cleaned up after the successful grade


def test_a_grade_that_keeps_failing_is_flagged_not_zero() -> None:
    env, _ = make_env(fail_times=None)
    with serve_in_thread(env.app) as url:
        assert call_tool(url, "trace_b").status_code == 200
        grade = endpoint_grader(url).grade({"output_text": ""}, {}, "trace_b")
    assert grade.error == "unresponsive_reward_error"
    assert math.isnan(grade.score)
    assert env.active_traces == ["trace_b"]  # kept: nothing was graded


def test_grading_a_cleaned_up_trace_is_a_flagged_4xx() -> None:
    env, seen = make_env(fail_times=0)
    with serve_in_thread(env.app) as url:
        assert call_tool(url, "trace_c").status_code == 200
        first = endpoint_grader(url).grade({"output_text": ""}, {}, "trace_c")
        again = endpoint_grader(url).grade({"output_text": ""}, {}, "trace_c")
        tool_after = call_tool(url, "trace_c")
        no_trace = httpx.post(f"{url}/grade", json={"sample": {}, "item": {}})
    assert first.score == 1.0
    assert again.error == "endpoint_grader_client_error"
    assert (
        "410" in again.metrics["error_details"]
        and "already cleaned up" in again.metrics["error_details"]
    )
    assert math.isnan(again.score)
    assert tool_after.status_code == 410
    assert no_trace.status_code == 400
    assert seen["starts"] == 1
