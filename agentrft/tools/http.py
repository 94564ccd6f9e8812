"""HTTP tools, exactly per the OpenAI Agent RFT contract, and the retry rule shared with
the endpoint grader.

Request:  POST server_url  {"type": "function_call", "id", "call_id", "name",
                            "arguments": "<JSON string>", "trace_id", "item"}
Response: {"type": "function_call_output", "call_id", "id", "output": "<string>"}

- 4xx: the body is shown to the model as the tool output.
- 5xx, timeouts, connection errors, malformed replies: retried `retries` times with
  exponential backoff, then `ToolUnavailable` (the rollout is discarded, never scored 0).
- The timeout is one deadline for the whole attempt (connect, send, every byte of the
  reply), not a limit per read: a server that trickles bytes is cut at the deadline.
- A payload over 1 MiB either way is refused without being sent or read further.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agentrft.errors import EndpointUnavailable, ToolUnavailable
from agentrft.redact import redact_urls
from agentrft.tools.env_token import with_env_token
from agentrft.types import ToolCall, ToolResult

MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB each way


class PayloadTooLarge(Exception):
    """A response body went past MAX_PAYLOAD_BYTES; it was not read further."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    attempts: int
    latency_s: float


@functools.cache
def _tls() -> ssl.SSLContext:
    """Built once: creating a TLS context costs ~20 ms, which every step would pay."""
    return ssl.create_default_context()


def new_client(max_connections: int = 64) -> httpx.AsyncClient:
    """One pooled client per event loop, shared by all tools and endpoint graders."""
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return httpx.AsyncClient(limits=limits, follow_redirects=False, verify=_tls())


async def _post_once(
    client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str], timeout: float
) -> tuple[int, bytes]:
    async with client.stream(
        "POST",
        url,
        content=body,
        headers={**headers, "content-type": "application/json"},
        timeout=timeout,
    ) as resp:
        declared = resp.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(int(declared))
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > MAX_PAYLOAD_BYTES:
                raise PayloadTooLarge(size)
            chunks.append(chunk)
        return resp.status_code, b"".join(chunks)


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    *,
    headers: Mapping[str, str],
    timeout: float,
    retries: int,
    backoff_s: float,
    error_cls: type[EndpointUnavailable] = EndpointUnavailable,
    validate: Any = None,
) -> Reply:
    """POST `body`; return the first 2xx/4xx reply. 5xx, timeouts, connection errors and
    2xx replies that `validate` rejects (it raises ValueError) are retried `retries` times
    (so at most retries + 1 attempts), then `error_cls` is raised with the last reason.
    PayloadTooLarge propagates at once: retrying would not shrink the reply."""
    t0 = time.perf_counter()
    reason = ""
    headers = with_env_token(url, headers)  # an environment server agentrft started
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            async with asyncio.timeout(
                timeout
            ):  # one deadline per attempt, however the bytes arrive
                status, data = await _post_once(client, url, body, headers, timeout)
        except (httpx.TimeoutException, TimeoutError):
            reason = f"timed out after {timeout:g}s"
            continue
        except httpx.TransportError as exc:
            reason = f"connection failed: {type(exc).__name__}: {exc}"
            continue
        if not (200 <= status < 300 or 400 <= status < 500):  # 5xx, and 1xx/3xx we do not follow
            reason = f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}"
            continue
        if 200 <= status < 300 and validate is not None:
            try:
                validate(data)
            except ValueError as exc:
                reason = f"malformed reply: {exc}"
                continue
        return Reply(status, data, attempt + 1, time.perf_counter() - t0)
    # the message becomes a discard reason, on disk and in metric keys: no URL credentials
    raise error_cls(redact_urls(f"{url}: {reason} (after {retries + 1} attempts)"))


def output_refused(
    call: ToolCall, latency_s: float, attempts: int, request_bytes: int = 0
) -> ToolResult:
    """What the model sees when a tool's output is over MAX_PAYLOAD_BYTES (an HTTP tool's
    reply or an in-process tool's return value alike)."""
    return ToolResult(
        call.call_id,
        call.name,
        f"Error: the output of {call.name!r} is over 1 MiB and was refused (413).",
        "refused",
        latency_s,
        attempts,
        request_bytes,
    )


def _function_call_output(data: bytes) -> str:
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), str):
        raise ValueError('expected {"type": "function_call_output", "output": "<string>", ...}')
    return obj["output"]


class HttpTool:
    """A tool hosted at `spec.server_url`. Picklable: the HTTP client is passed per call."""

    def __init__(self, spec: Any, *, timeout_s: float, retries: int, backoff_s: float) -> None:
        self.spec = spec
        self.name = spec.name
        self.timeout_s = spec.timeout_s or timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def __call__(
        self, call: ToolCall, trace_id: str, item: Mapping[str, Any], client: httpx.AsyncClient
    ) -> ToolResult:
        payload = {
            "type": "function_call",
            "id": call.id,
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "trace_id": trace_id,
            "item": dict(item),
        }
        body = json.dumps(payload, ensure_ascii=False).encode()
        if len(body) > MAX_PAYLOAD_BYTES:
            return ToolResult(
                call.call_id,
                call.name,
                f"Error: the request to {call.name!r} is over 1 MiB and was refused (413). Send smaller arguments.",
                "refused",
                request_bytes=len(body),
            )
        t0 = time.perf_counter()
        try:
            reply = await post_with_retries(
                client,
                self.spec.server_url,
                body,
                headers=self.spec.headers,
                timeout=self.timeout_s,
                retries=self.retries,
                backoff_s=self.backoff_s,
                error_cls=ToolUnavailable,
                validate=_function_call_output,
            )
        except PayloadTooLarge:
            return output_refused(call, time.perf_counter() - t0, 1, len(body))
        except ToolUnavailable as exc:
            raise ToolUnavailable(f"tool {call.name!r}: {exc}") from None
        if reply.status >= 400:  # 4xx: the model sees what the server said
            text = reply.body.decode("utf-8", "replace")
            return ToolResult(
                call.call_id,
                call.name,
                text,
                "client_error",
                reply.latency_s,
                reply.attempts,
                len(body),
            )
        return ToolResult(
            call.call_id,
            call.name,
            _function_call_output(reply.body),
            "ok",
            reply.latency_s,
            reply.attempts,
            len(body),
        )
