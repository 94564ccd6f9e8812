"""OpenAIChat against a flaky local endpoint: what is retried, what raises, what is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from agentrft.errors import EndpointUnavailable, GraderUnavailable
from agentrft.policy.openai_client import ChatRequestRejected, OpenAIChat, chat_url
from agentrft.policy.tool_format import FunctionSpec
from agentrft.tools.envkit import serve_in_thread

REPLY = {
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        },
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
}


class Flaky:
    """Fails the first `failures` requests of each path in its own way, then answers."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.app = FastAPI()

        @self.app.post("/{mode}/v1/chat/completions")
        async def chat(mode: str, request: Request) -> Any:
            seen = self.seen.setdefault(mode, [])
            seen.append(
                {
                    "body": await request.json(),
                    "auth": request.headers.get("authorization"),
                    "x": request.headers.get("x-team"),
                }
            )
            first = len(seen) <= 2
            if mode == "down" or (mode == "5xx" and first):
                return PlainTextResponse("overloaded", status_code=503)
            if mode == "429" and first:
                return JSONResponse({"error": {"message": "slow down"}}, status_code=429)
            if mode == "garbled" and first:
                return PlainTextResponse("<html>proxy error</html>")
            if mode == "400":
                return JSONResponse(
                    {"error": {"message": "prompt too long", "code": "context_length_exceeded"}},
                    status_code=400,
                )
            return REPLY


@pytest.fixture(scope="module")
def flaky() -> Iterator[tuple[Flaky, str]]:
    server = Flaky()
    with serve_in_thread(server.app) as url:
        yield server, url


def chat(url: str, mode: str, **kw: Any) -> OpenAIChat:
    return OpenAIChat(f"{url}/{mode}/v1", "m", backoff_s=0.01, **kw)


@pytest.mark.parametrize("mode", ["5xx", "429", "garbled"])
def test_transient_failures_are_retried(flaky: tuple[Flaky, str], mode: str) -> None:
    server, url = flaky
    choices = asyncio.run(chat(url, mode).chat([{"role": "user", "content": "x"}]))
    assert len(server.seen[mode]) == 3
    assert [c.content for c in choices] == ["hi", None]


def test_choices_usage_and_request_body(
    flaky: tuple[Flaky, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url = flaky
    monkeypatch.setenv("AGENTRFT_TEST_KEY", "sk-test")
    spec = FunctionSpec("f", "does f", {"type": "object", "properties": {}})
    client = chat(url, "ok", api_key_env="AGENTRFT_TEST_KEY", headers={"x-team": "a"})
    choices = asyncio.run(
        client.chat(
            [{"role": "user", "content": "x"}],
            tools=[spec],
            n=2,
            temperature=0.5,
            seed=None,
            stop=["</tool_call>"],
        )
    )
    sent = server.seen["ok"][-1]
    assert sent["auth"] == "Bearer sk-test" and sent["x"] == "a"
    assert sent["body"] == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "n": 2,
        "temperature": 0.5,
        "stop": ["</tool_call>"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "does f",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
    }
    first, second = choices
    assert (first.finish_reason, second.finish_reason) == ("stop", "tool_calls")
    assert second.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [REPLY["choices"][1]["message"]["tool_calls"][0]],
    }
    assert (
        first.usage == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
        and first.latency_s > 0
    )
    json.dumps(first.message)


def test_an_endpoint_that_stays_down_raises_the_chosen_error(flaky: tuple[Flaky, str]) -> None:
    server, url = flaky
    with pytest.raises(GraderUnavailable, match="HTTP 503"):
        asyncio.run(
            chat(url, "down", retries=2, error_cls=GraderUnavailable).chat(
                [{"role": "user", "content": "x"}]
            )
        )
    assert len(server.seen["down"]) == 3
    with pytest.raises(EndpointUnavailable, match="connection failed"):
        asyncio.run(
            OpenAIChat("http://127.0.0.1:9", "m", retries=1, backoff_s=0.01).chat(
                [{"role": "user", "content": "x"}]
            )
        )


def test_client_errors_raise_at_once(flaky: tuple[Flaky, str]) -> None:
    server, url = flaky
    with pytest.raises(ChatRequestRejected, match="prompt too long") as info:
        asyncio.run(chat(url, "400").chat([{"role": "user", "content": "x"}]))
    assert (info.value.status, info.value.code) == (400, "context_length_exceeded")
    assert len(server.seen["400"]) == 1


def test_chat_url() -> None:
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert (
        chat_url("https://x.example/openai/deployments/d")
        == "https://x.example/openai/deployments/d/chat/completions"
    )
