"""Builders for grader tests: trajectories without a model, and loopback HTTP servers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from agentrft.tools.envkit import serve_in_thread
from agentrft.types import Item, StopReason, ToolCall, ToolResult, Trajectory, Turn


def make_trajectory(
    final_text: str,
    calls_per_turn: list[list[tuple[str, dict[str, Any]]]] = (),  # type: ignore[assignment]
    *,
    fields: dict[str, Any] | None = None,
    stop: StopReason = StopReason.FINAL_ANSWER,
    discarded: str | None = None,
    trace_id: str = "trace_test",
    final_calls: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
) -> Trajectory:
    """A rollout: one turn per entry of `calls_per_turn` (each call answered "out:<name>"),
    then a last turn with `final_text` (and `final_calls`, left unanswered)."""
    item = Item(0, ({"role": "user", "content": "question"},), fields or {}, "test.jsonl:1")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "question"}]
    turns = []
    n = 0
    for i, calls in enumerate(calls_per_turn):
        tcs, trs = [], []
        for name, args in calls:
            n += 1
            tcs.append(ToolCall(f"fc_{n}", f"call_{n}", name, json.dumps(args)))
            trs.append(ToolResult(f"call_{n}", name, f"out:{name}", "ok"))
        text = "".join(
            f'<tool_call>{{"name": "{c.name}", "arguments": {c.arguments}}}</tool_call>'
            for c in tcs
        )
        turns.append(Turn(i, text, 5, tuple(tcs), tuple(trs)))
        messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in tcs
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.output}
            for r in trs
        )
    fcs = []
    for name, args in final_calls:
        n += 1
        fcs.append(ToolCall(f"fc_{n}", f"call_{n}", name, json.dumps(args)))
    text = final_text + "".join(
        f'<tool_call>{{"name": "{c.name}", "arguments": {c.arguments}}}</tool_call>' for c in fcs
    )
    turns.append(Turn(len(turns), text, 5, tuple(fcs), ()))
    messages.append({"role": "assistant", "content": text})
    return Trajectory(trace_id, item, tuple(messages), tuple(turns), (), (), (), stop, discarded)


@pytest.fixture
def serve() -> Iterator[Callable[[FastAPI], str]]:
    """Start FastAPI apps on loopback for one test; yields a function app -> base URL."""
    stack: list[Any] = []

    def start(app: FastAPI) -> str:
        cm = serve_in_thread(app)
        url = cm.__enter__()
        stack.append(cm)
        return url

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


class Recorder:
    """A scripted HTTP endpoint: each request is recorded; replies come from `script`
    (a list of (status, body) used in order, the last repeating)."""

    def __init__(self, script: list[tuple[int, Any]]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()

        @self.app.post("/{path:path}")
        async def handle(path: str, request: Request) -> Any:
            body = json.loads(await request.body())
            self.requests.append({"path": path, "headers": dict(request.headers), "body": body})
            status, reply = self.script[min(len(self.requests) - 1, len(self.script) - 1)]
            if isinstance(reply, str):
                return PlainTextResponse(reply, status_code=status)
            return JSONResponse(reply, status_code=status)


@pytest.fixture
def recorder(
    serve: Callable[[FastAPI], str],
) -> Callable[[list[tuple[int, Any]]], tuple[Recorder, str]]:
    def make(script: list[tuple[int, Any]]) -> tuple[Recorder, str]:
        rec = Recorder(script)
        return rec, serve(rec.app)

    return make
