"""A chat-level client for any OpenAI-compatible endpoint (OpenAI, vLLM, `agentrft
serve-model`, ...): evaluating a hosted or served model (`rollout/chat_episode.py`) and
calling model graders' judges.

It speaks `POST {base_url}/chat/completions` over httpx with the same retry rule as tools
(`agentrft.tools.http.post_with_retries`): 5xx, timeouts, connection errors and malformed
replies are retried, then `error_cls` is raised (EndpointUnavailable by default;
GraderUnavailable for judges, so the sample is discarded, never scored 0). A 429 is
retried the same way. Any other 4xx means the request itself is wrong and raises
`ChatRequestRejected` at once, with the endpoint's message and code.

`OpenAIChat` holds only settings (picklable); the API key is read from the environment at
call time and never stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from agentrft.errors import AgentRFTError, EndpointUnavailable
from agentrft.policy.tool_format import tool_schema
from agentrft.tools.http import post_with_retries


class ChatRequestRejected(AgentRFTError, ValueError):
    """The endpoint refused the request with a 4xx (other than 429): retrying cannot help.
    `code` is OpenAI's error code when given, e.g. "context_length_exceeded"."""

    def __init__(self, message: str, status: int, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ChatChoice:
    """One choice of a chat completion."""

    index: int
    content: str | None
    tool_calls: tuple[
        Mapping[str, Any], ...
    ]  # OpenAI shape: {"id", "type": "function", "function": {"name", "arguments"}}
    finish_reason: str  # stop | length | tool_calls | content_filter
    usage: Mapping[
        str, int
    ]  # the whole request's token usage, shared by its n choices ({} if not reported)
    latency_s: float  # the whole request's

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message to send back in the next request's history."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        return msg


def chat_url(base_url: str) -> str:
    """`{base_url}/chat/completions`; a bare `http://host:port` gets OpenAI's `/v1` prefix."""
    base = base_url.rstrip("/")
    if urlsplit(base).path in ("", "/"):
        base += "/v1"
    return base + "/chat/completions"


def _openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI function-tool dicts, from dicts already in that shape or from specs with
    `name`, `description` and `parameters` (a job's ToolSpec, a FunctionSpec)."""
    return [dict(t) if isinstance(t, Mapping) else tool_schema(t) for t in tools]


def _choices(data: bytes) -> list[dict[str, Any]]:
    """The reply's choices; ValueError (retried as malformed) when it has none."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices)
    ):
        raise ValueError('expected {"choices": [{"message": {...}, "finish_reason": ...}, ...]}')
    return choices


def _rejection(status: int, body: bytes, url: str) -> ChatRequestRejected:
    message, code = body[:500].decode("utf-8", "replace"), None
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict):
            message, code = str(err.get("message") or message), err.get("code")
        elif isinstance(err, str):
            message = err
    except (json.JSONDecodeError, AttributeError):
        pass
    return ChatRequestRejected(
        f"{url} refused the request (HTTP {status}): {message}", status, code
    )


@dataclass(frozen=True)
class OpenAIChat:
    """Settings for one model at one endpoint. `chat` does the calls."""

    base_url: str  # e.g. "http://127.0.0.1:8000/v1" or "https://api.openai.com/v1"
    model: str
    api_key_env: str | None = (
        "OPENAI_API_KEY"  # read at call time; None or unset: no Authorization header
    )
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 0.5
    error_cls: type[EndpointUnavailable] = EndpointUnavailable

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {**({"authorization": f"Bearer {key}"} if key else {}), **self.headers}

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        n: int = 1,
        *,
        client: httpx.AsyncClient | None = None,
        **sampling: Any,
    ) -> list[ChatChoice]:
        """One chat completion with `n` choices. `sampling` holds any other request field
        (temperature, top_p, max_tokens, seed, stop, tool_choice, ...); None values are not
        sent. `client` is the event loop's shared pool; without one a client is made for
        this call."""
        if client is None:
            async with httpx.AsyncClient() as own:
                return await self.chat(messages, tools, n, client=own, **sampling)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "n": n,
        }
        if tools:
            body["tools"] = _openai_tools(tools)
        body.update({k: v for k, v in sampling.items() if v is not None})
        payload = json.dumps(body, ensure_ascii=False).encode()
        url = chat_url(self.base_url)
        t0 = time.perf_counter()
        for attempt in range(self.retries + 1):
            reply = await post_with_retries(
                client,
                url,
                payload,
                headers=self._headers(),
                timeout=self.timeout_s,
                retries=self.retries,
                backoff_s=self.backoff_s,
                error_cls=self.error_cls,
                validate=_choices,
            )
            if reply.status != 429:
                break
            if attempt == self.retries:
                raise self.error_cls(
                    f"{url}: rate limited (HTTP 429) on every attempt: {reply.body[:200].decode('utf-8', 'replace')}"
                )
            await asyncio.sleep(self.backoff_s * 2**attempt)
        if reply.status >= 400:
            raise _rejection(reply.status, reply.body, url)
        latency = time.perf_counter() - t0
        usage = json.loads(reply.body).get("usage") or {}
        return [
            ChatChoice(
                index=int(c.get("index", i)),
                content=c["message"].get("content"),
                tool_calls=tuple(c["message"].get("tool_calls") or ()),
                finish_reason=str(c.get("finish_reason") or "stop"),
                usage={k: int(v) for k, v in usage.items() if isinstance(v, int)},
                latency_s=latency,
            )
            for i, c in enumerate(_choices(reply.body))
        ]
