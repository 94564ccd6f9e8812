"""endpoint graders against real loopback servers: the Agent RFT grading contract, the
shared retry rule, and discard flags."""

from __future__ import annotations

import asyncio
import math
import pickle
import time

from agentrft.graders import build_grader, sample_from_text
from agentrft.tools.envkit import ToolServer


def spec(url: str, **extra: object) -> dict:
    return {"type": "endpoint", "name": "env", "url": url, "backoff_s": 0.01, **extra}


def test_success_sends_sample_item_trace_and_headers(recorder) -> None:
    rec, url = recorder(
        [(200, {"score": 0.7, "sub_scores": {"tests": 1.0}, "metrics": {"note": "ok"}})]
    )
    g = build_grader(
        spec(f"{url}/grade", headers={"Authorization": "Bearer s3cret", "X-Env": "demo"})
    )
    grade = g.grade(sample_from_text("answer"), {"id": 7}, "trace_abc")
    assert grade.error is None
    assert grade.score == 0.7
    assert grade.sub_scores == {"tests": 1.0}
    assert grade.metrics["note"] == "ok"
    (req,) = rec.requests
    assert req["headers"]["authorization"] == "Bearer s3cret"
    assert req["headers"]["x-env"] == "demo"
    assert req["body"]["trace_id"] == "trace_abc"
    assert req["body"]["item"] == {"id": 7}
    assert req["body"]["sample"]["output_text"] == "answer"


def test_5xx_is_retried_then_succeeds(recorder) -> None:
    rec, url = recorder([(503, "busy"), (500, "oops"), (200, {"score": 1.0})])
    grade = build_grader(spec(url)).grade(sample_from_text("a"), {})
    assert grade.score == 1.0
    assert grade.metrics["attempts"] == 3
    assert len(rec.requests) == 3


def test_5xx_three_retries_then_discarded(recorder) -> None:
    rec, url = recorder([(500, "down")])
    grade = build_grader(spec(url)).grade(sample_from_text("a"), {})
    assert grade.error == "unresponsive_reward_error"
    assert math.isnan(grade.score)
    assert len(rec.requests) == 4  # 1 + 3 retries
    assert "HTTP 500" in grade.metrics["error_details"]


def test_a_reply_that_is_not_a_json_object_is_retried_then_discarded(recorder) -> None:
    rec, url = recorder([(200, "<html>bad gateway</html>"), (200, [1.0])])
    grade = build_grader(spec(url, retries=1)).grade(sample_from_text("a"), {})
    assert grade.error == "unresponsive_reward_error"
    assert len(rec.requests) == 2


def test_4xx_is_a_client_error_not_retried(recorder) -> None:
    rec, url = recorder([(422, "bad sample")])
    grade = build_grader(spec(url)).grade(sample_from_text("a"), {})
    assert grade.error == "endpoint_grader_client_error"
    assert "bad sample" in grade.metrics["error_details"]
    assert len(rec.requests) == 1


def test_connection_refused_is_discarded() -> None:
    from agentrft.tools.envkit import free_port

    grade = build_grader(spec(f"http://127.0.0.1:{free_port()}/grade", retries=1)).grade(
        sample_from_text("a"), {}
    )
    assert grade.error == "unresponsive_reward_error"
    assert "connection failed" in grade.metrics["error_details"]


def test_oversized_sample_is_not_sent(recorder) -> None:
    rec, url = recorder([(200, {"score": 1.0})])
    grade = build_grader(spec(url)).grade(sample_from_text("x" * (1 << 20)), {})
    assert grade.error == "endpoint_grader_client_error"
    assert not rec.requests


def test_rate_limit_spaces_requests(recorder) -> None:
    rec, url = recorder([(200, {"score": 1.0})])
    g = build_grader(spec(url, rate_limit=20))

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(g.agrade(sample_from_text("a"), {}) for _ in range(6)))
        return time.perf_counter() - t0

    assert asyncio.run(main()) >= 5 / 20 - 0.01
    assert len(rec.requests) == 6


def test_envkit_grader_sees_the_rollouts_trace_state(serve) -> None:
    """The endpoint grader meets envkit's /grade route: per-trace state set by a tool call is
    visible when the same trace_id is graded."""
    env = ToolServer("t")

    @env.tool
    def touch(ctx) -> str:
        ctx.state["touched"] = True
        return "ok"

    @env.grader
    def grade(ctx, sample, item) -> float:
        return 1.0 if ctx.state.get("touched") else 0.25

    url = serve(env.app)
    import httpx

    httpx.post(
        f"{url}/tools/touch", json={"arguments": "{}", "trace_id": "trace_1", "item": {}}
    ).raise_for_status()
    g = pickle.loads(pickle.dumps(build_grader(spec(f"{url}/grade"))))
    assert g.grade(sample_from_text("a"), {}, "trace_1").score == 1.0
    assert g.grade(sample_from_text("a"), {}, "trace_2").score == 0.25
