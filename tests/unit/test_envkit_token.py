"""envkit's optional shared token: with one, every route but /health refuses a request
without it (401) and keeps the trace's state; an environment agentrft starts for a job gets
a fresh token, which agentrft's tool calls, endpoint grades and /cleanup send on their own."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from agentrft.graders import build_grader, sample_from_text
from agentrft.graders.groups import cleanup_traces
from agentrft.job import ToolSpec
from agentrft.tools.env_token import TOKEN_HEADER
from agentrft.tools.envkit import ToolServer, serve_in_thread
from agentrft.tools.http import HttpTool, new_client
from agentrft.tools.launch import launch_environment
from agentrft.types import ToolCall

CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "count",
    "arguments": "{}",
    "trace_id": "trace_a",
    "item": {},
}
APP = """
from agentrft.tools.envkit import ToolServer

env = ToolServer("counter")

@env.tool(description="count calls", parameters={"type": "object", "properties": {}})
def count(ctx):
    ctx.state["n"] = ctx.state.get("n", 0) + 1
    return str(ctx.state["n"])

@env.grader
def grade(ctx, sample, item):
    return ctx.state.get("n", 0) / 10

app = env.app
"""


def counter(token: str | None) -> ToolServer:
    env = ToolServer("counter", token=token, cleanup_after_grade=False)

    @env.tool
    def count(ctx: Any) -> str:
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        return str(ctx.state["n"])

    return env


def test_a_token_guards_every_route_but_health() -> None:
    env = counter("s3cret-token")
    with serve_in_thread(env.app) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        refused = httpx.post(f"{url}/tools/count", json=CALL)
        assert refused.status_code == 401 and f"missing {TOKEN_HEADER}" in refused.text
        wrong = httpx.post(f"{url}/tools/count", json=CALL, headers={TOKEN_HEADER: "guess"})
        assert wrong.status_code == 401 and "wrong" in wrong.text
        ok = httpx.post(f"{url}/tools/count", json=CALL, headers={TOKEN_HEADER: "s3cret-token"})
        assert ok.status_code == 200 and ok.json()["output"] == "1"
        for path in ("/cleanup", "/grade"):
            assert httpx.post(url + path, json={"trace_id": "trace_a"}).status_code == 401
        assert httpx.get(f"{url}/tools").status_code == 401
        assert env.active_traces == ["trace_a"]  # the refused /cleanup removed nothing


def test_without_a_token_the_routes_stay_open() -> None:
    with serve_in_thread(counter(None).app) as url:
        assert httpx.post(f"{url}/tools/count", json=CALL).status_code == 200


def test_an_environment_agentrft_starts_gets_a_token_agentrft_sends(tmp_path: Path) -> None:
    (tmp_path / "counter_env.py").write_text(textwrap.dedent(APP))
    with launch_environment(
        "counter_env:app", tmp_path, startup_timeout_s=60, env={"PYTHONPATH": ":".join(sys.path)}
    ) as url:
        assert httpx.post(f"{url}/tools/count", json=CALL).status_code == 401  # a stranger
        spec = ToolSpec(name="count", server_url=f"{url}/tools/count")
        tool = HttpTool(spec, timeout_s=10, retries=0, backoff_s=0)

        async def call() -> str:
            async with new_client() as client:
                result = await tool(
                    ToolCall("fc_1", "call_1", "count", "{}"), "trace_a", {}, client
                )
            return result.output

        assert asyncio.run(call()) == "1"
        grader = build_grader({"type": "endpoint", "url": f"{url}/grade", "retries": 0})
        grade = grader.grade(sample_from_text("x"), {}, "trace_a")
        assert grade.error is None and grade.score == 0.1

        class Traj:
            trace_id = "trace_a"

        asyncio.run(cleanup_traces(url, [Traj()]))  # type: ignore[list-item]
        gone = build_grader({"type": "endpoint", "url": f"{url}/grade", "retries": 0})
        assert gone.grade(sample_from_text("x"), {}, "trace_a").error is not None  # 410: cleaned up
