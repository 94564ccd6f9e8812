"""Tools from MCP servers, called with the same rules as HTTP tools (`agentrft.tools.http`).

`mcp_tools(servers, ...)` lists each server's tools once (`tools/list`, paged, filtered by the
server's allow-list) and returns one `McpTool` per tool; its schema is rendered like any other.
At run time:
- one MCP session per rollout and server, opened at the rollout's first call and closed when
  the rollout ends (`release`); a stdio server is one process per rollout, started and stopped
  (and reaped) by the SDK's stdio client;
- every call carries the rollout's `trace_id` in `_meta` (`{"trace_id", "item"}`) and, over
  HTTP, in the `X-Agentrft-Trace-Id` header, so a server can keep per-rollout state;
- a tool error (`isError`) or a JSON-RPC "invalid params" is shown to the model as text (the
  4xx of HTTP tools);
- a timeout, a lost connection, a crashed server or a server-side exception is retried
  `retries` times with backoff, each retry on a fresh session, then `ToolUnavailable`: the
  rollout is discarded, never scored 0. A stdio server that died is not retried: its state
  died with it;
- a request or an output over 1 MiB is refused, as over HTTP.

Each session lives in its own task (the SDK's transports are anyio task groups, which must be
left by the task that entered them), so the calls of one turn can share it concurrently.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from agentrft.errors import ConfigError, ToolUnavailable
from agentrft.redact import redact_urls
from agentrft.tools.env_token import with_env_token
from agentrft.tools.http import MAX_PAYLOAD_BYTES, output_refused
from agentrft.tools.mcp_spec import TRACE_HEADER, McpServer
from agentrft.types import FunctionSpec, ToolCall, ToolResult

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the names a job's tools may have
_INVALID_PARAMS = -32602  # JSON-RPC: the model's arguments were wrong


@dataclass
class _Session:
    ready: asyncio.Future[Any]
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class McpConnection:
    """One server's sessions, one per trace_id. Picklable: open sessions stay behind."""

    def __init__(self, server: McpServer, *, url: str | None, cwd: Path) -> None:
        self.server = server
        self.url = url  # bare paths already joined to the environment server's base URL
        self.cwd = cwd
        self._sessions: dict[str, _Session] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sessions": {}}

    @property
    def label(self) -> str:
        return redact_urls(self.url or self.server.label)

    @property
    def stdio(self) -> bool:
        return self.server.command is not None

    def client(self, trace_id: str | None) -> Any:
        """An unentered `mcp.Client` for one session (`trace_id` None: listing tools)."""
        from mcp import Client, StdioServerParameters

        if self.server.command is not None:
            cmd = self.server.command
            params = StdioServerParameters(
                command=cmd[0], args=list(cmd[1:]), env=dict(self.server.env), cwd=self.cwd
            )
            return Client(params, cache=None)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert self.url is not None
        # an environment server agentrft launched takes its shared token (tools/env_token.py)
        headers = dict(with_env_token(self.url, self.server.headers))
        if trace_id is not None:
            headers[TRACE_HEADER] = trace_id
        http = httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self.server.startup_timeout_s, read=300.0)
        )
        assert self.url is not None
        return Client(streamable_http_client(self.url, http_client=http), cache=None)

    async def session(self, trace_id: str) -> Any:
        """The open session of `trace_id`, opened on first use."""
        s = self._sessions.get(trace_id)
        if s is None:
            s = self._sessions[trace_id] = _Session(asyncio.get_running_loop().create_future())
            s.task = asyncio.create_task(self._hold(trace_id, s))
        async with asyncio.timeout(self.server.startup_timeout_s):
            return await asyncio.shield(s.ready)

    async def _hold(self, trace_id: str, s: _Session) -> None:
        try:
            async with self.client(trace_id) as client:
                s.ready.set_result(client)
                await s.closing.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting calls
            if not s.ready.done():
                s.ready.set_exception(ToolUnavailable(_why(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def release(self, trace_id: str) -> None:
        """Close `trace_id`'s session (stops a stdio server); never raises."""
        s = self._sessions.pop(trace_id, None)
        if s is None or s.task is None:
            return
        s.closing.set()
        try:
            async with asyncio.timeout(10):
                await s.task
        except TimeoutError:
            s.task.cancel()
            log.warning("MCP session of %s on %s did not close within 10s", trace_id, self.label)
        except Exception as exc:  # a session that already failed; its calls said so
            log.debug("MCP session of %s on %s ended with %r", trace_id, self.label, exc)
        if not s.ready.done():
            s.ready.cancel()
        elif not s.ready.cancelled():
            s.ready.exception()  # retrieved: a failed open is not reported twice


def _why(exc: BaseException) -> str:
    """The root cause of `exc` (the SDK's task groups wrap failures in ExceptionGroups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _text(result: Any) -> str:
    """What the model sees of a CallToolResult: its text blocks; other blocks as JSON."""
    parts = []
    for block in result.content:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


class McpTool:
    """One tool of an MCP server, as an agentrft `Tool`. Picklable."""

    def __init__(
        self,
        spec: FunctionSpec,
        connection: McpConnection,
        *,
        timeout_s: float,
        retries: int,
        backoff_s: float,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.connection = connection
        self.timeout_s = connection.server.timeout_s or timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def release(self, trace_id: str) -> None:
        await self.connection.release(trace_id)

    async def __call__(
        self, call: ToolCall, trace_id: str, item: Mapping[str, Any], client: Any = None
    ) -> ToolResult:
        args = json.loads(call.arguments or "{}")
        meta = {"trace_id": trace_id, "item": dict(item)}
        request_bytes = len(json.dumps([args, meta], ensure_ascii=False, default=str).encode())
        if request_bytes > MAX_PAYLOAD_BYTES:
            return ToolResult(
                call.call_id,
                call.name,
                f"Error: the request to {call.name!r} is over 1 MiB and was refused (413). Send smaller arguments.",
                "refused",
                request_bytes=request_bytes,
            )
        from mcp import MCPError

        t0 = time.perf_counter()
        reason = ""
        conn = self.connection
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                session = await conn.session(trace_id)
                async with asyncio.timeout(self.timeout_s):
                    result = await session.call_tool(
                        call.name, args, read_timeout_seconds=self.timeout_s, meta=meta
                    )
            except MCPError as exc:
                if exc.code == _INVALID_PARAMS:  # the model's mistake: it sees what was wrong
                    return ToolResult(
                        call.call_id,
                        call.name,
                        f"Error: {exc.message}",
                        "client_error",
                        time.perf_counter() - t0,
                        attempt + 1,
                        request_bytes,
                    )
                reason = f"MCP error {exc.code}: {exc.message}"
            except TimeoutError:
                reason = f"timed out after {self.timeout_s:g}s"
            except ToolUnavailable as exc:
                reason = f"could not open a session: {exc}"
            except Exception as exc:  # the transport failed: connection lost, server gone
                reason = _why(exc)
            else:
                text = _text(result)
                latency = time.perf_counter() - t0
                if len(text.encode()) > MAX_PAYLOAD_BYTES:
                    return output_refused(call, latency, attempt + 1, request_bytes)
                if result.is_error:
                    return ToolResult(
                        call.call_id,
                        call.name,
                        f"Error: {text}",
                        "client_error",
                        latency,
                        attempt + 1,
                        request_bytes,
                    )
                return ToolResult(
                    call.call_id, call.name, text, "ok", latency, attempt + 1, request_bytes
                )
            await conn.release(trace_id)  # a retry opens a fresh session
            if conn.stdio:
                break  # the process held the rollout's state; a new one would start empty
        raise ToolUnavailable(
            redact_urls(
                f"tool {call.name!r} (MCP server {conn.label}): {reason} (after {attempt + 1} attempts)"
            )
        )


async def _list_tools(conn: McpConnection) -> list[Any]:
    async with asyncio.timeout(conn.server.startup_timeout_s), conn.client(None) as client:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools


def _run_in_thread(coro: Any) -> Any:
    """`asyncio.run(coro)` in a helper thread: callable from inside a running event loop."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="agentrft-mcp-list")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _specs(conn: McpConnection, listed: list[Any]) -> list[FunctionSpec]:
    by_name = {t.name: t for t in listed}
    allowed = conn.server.tools
    if allowed is not None:
        missing = [n for n in allowed if n not in by_name]
        if missing:
            raise ConfigError(
                f"MCP server {conn.label} has no tool {', '.join(map(repr, missing))}; it lists "
                f"{sorted(by_name)} -> fix the server's `tools` allow-list"
            )
    specs = []
    for name in allowed if allowed is not None else list(by_name):
        tool = by_name[name]
        if not _NAME.match(name):
            raise ConfigError(
                f"MCP server {conn.label}: tool name {name!r} is not 1-64 of A-Z a-z 0-9 _ - "
                "-> leave it out of the server's `tools` allow-list, or rename it on the server"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(
                f"MCP server {conn.label}: tool {name!r} has an invalid input schema: {exc.message}"
            ) from None
        specs.append(FunctionSpec(name, tool.description or "", dict(tool.input_schema)))
    return specs


def mcp_tools(
    servers: Sequence[McpServer],
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    base_url: str | None = None,
    base_dir: str | Path = ".",
    taken: Sequence[str] = (),
) -> dict[str, McpTool]:
    """The tools of every server, by name, listed now. `taken`: names the job's other tools
    use. Raises ConfigError (with the fix) for an unreachable server, an allow-listed tool it
    lacks, a bad name or schema, or a name two sources share."""
    tools: dict[str, McpTool] = {}
    owner = {name: "the job's `tools`" for name in taken}
    for i, server in enumerate(servers):
        url = server.url
        if url is not None and url.startswith("/"):
            if base_url is None:
                raise ConfigError(
                    f"agentrft.mcp_servers.{i}: url {url!r} is a bare path, which needs "
                    "`agentrft.environment` (a server agentrft starts); otherwise give a full http(s) URL"
                )
            url = base_url.rstrip("/") + url
        conn = McpConnection(server, url=url, cwd=Path(base_dir) / server.cwd)
        try:
            listed = _run_in_thread(_list_tools(conn))
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                redact_urls(
                    f"agentrft.mcp_servers.{i}: cannot list the tools of MCP server {conn.label}: "
                    f"{_why(exc)} -> check that it runs and speaks MCP"
                )
            ) from None
        for spec in _specs(conn, listed):
            if spec.name in owner:
                raise ConfigError(
                    f"tool {spec.name!r} of MCP server {conn.label} is also defined by {owner[spec.name]} "
                    "-> keep one: leave it out of an allow-list (`tools: [...]`)"
                )
            owner[spec.name] = f"MCP server {conn.label}"
            tools[spec.name] = McpTool(
                spec, conn, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s
            )
    return tools
