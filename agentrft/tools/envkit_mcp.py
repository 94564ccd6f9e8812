"""envkit's tools over MCP: the `/mcp` route of every `ToolServer` app (streamable HTTP, the
official SDK's server side), so one environment serves training and a team's own agents.

- `tools/list` lists the same tools, schemas and descriptions as `GET /tools`.
- `tools/call` runs the same function as `POST /tools/{name}`, on the same per-trace state:
  the trace is the call's `_meta.trace_id` (else the `X-Agentrft-Trace-Id` header), and
  `_meta.item` is the row, as the HTTP body's `item` is. A call without a trace_id is refused.
- The model's mistakes (`ToolInputError`, wrong arguments, an unknown tool, a path that loops)
  and a trace already cleaned up answer `isError` with the message, as HTTP answers a 4xx.
  Any other exception is an MCP error, which agentrft retries and then discards the rollout.
- Stateless transport: no session state lives here (the state is per trace, not per session),
  so a client may reconnect freely. Requests over 1 MiB are refused.

The SDK's session manager runs inside the app's lifespan, one fresh manager per start; an app
served with lifespan off starts one at its first MCP request, for as long as its loop runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agentrft.tools.http import MAX_PAYLOAD_BYTES
from agentrft.tools.mcp_spec import TRACE_HEADER
from agentrft.tools.python import ToolInputError

if TYPE_CHECKING:
    from agentrft.tools.envkit import ToolServer


_STATE_KEY = "agentrft_mcp_manager"


class McpEndpoint:
    """The ASGI app at /mcp for one ToolServer. `running()` wraps the app's lifespan."""

    def __init__(self, env: ToolServer) -> None:
        self.env = env
        self._server: Any = None
        self._lazy: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future[Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._holder: asyncio.Task[None] | None = None

    def _mcp_server(self) -> Any:
        import mcp_types as types
        from mcp.server.lowlevel import Server

        env = self.env

        async def list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(
                tools=[
                    types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
                    for t in env._tools.values()
                ]
            )

        async def call_tool(ctx: Any, params: Any) -> Any:
            from agentrft.tools.envkit import TraceGone, bad_path, tool_text

            def error(text: str) -> Any:
                return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)

            meta = dict(ctx.meta or {})
            request = ctx.request
            headers = {k.lower(): v for k, v in request.headers.items()} if request else {}
            trace_id = str(meta.get("trace_id") or headers.get(TRACE_HEADER.lower()) or "")
            if not trace_id:
                return error(
                    f"missing trace_id: send it in `_meta.trace_id` or the {TRACE_HEADER} header"
                )
            if params.name not in env._tools:
                return error(f"unknown tool {params.name!r}; this server has {sorted(env._tools)}")
            sent = meta.get("item")
            item: dict[str, Any] = sent if isinstance(sent, dict) else {}
            try:
                out = await env.call_tool(
                    params.name, dict(params.arguments or {}), trace_id, item, headers
                )
            except (ToolInputError, TraceGone) as exc:
                return error(str(exc))
            except (OSError, RuntimeError) as exc:
                why = bad_path(exc)
                if why is None:
                    raise
                return error(why)
            return types.CallToolResult(content=[types.TextContent(text=tool_text(out))])

        return Server(env.name, on_list_tools=list_tools, on_call_tool=call_tool)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[dict[str, Any]]:
        """A fresh session manager for one start of the app; yields the lifespan state that
        hands it to this server's requests (one app may be served twice at once)."""
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        if self._server is None:
            self._server = self._mcp_server()
        manager = StreamableHTTPSessionManager(
            app=self._server,
            stateless=True,
            json_response=True,
            # like the HTTP routes beside it: any Host (an environment may sit behind a proxy)
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=MAX_PAYLOAD_BYTES,
        )
        async with manager.run():
            yield {_STATE_KEY: manager}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        manager = (scope.get("state") or {}).get(_STATE_KEY) or await self._without_lifespan()
        await manager.asgi_app(scope, receive, send)

    async def _without_lifespan(self) -> Any:
        """Served with lifespan off (`serve_in_thread`): a manager for this event loop, started
        by the first request and stopped when the loop ends."""
        loop = asyncio.get_running_loop()
        ready = self._lazy.get(loop)
        if ready is None:
            ready = self._lazy[loop] = loop.create_future()

            async def hold() -> None:
                try:
                    async with self.running() as state:
                        ready.set_result(state[_STATE_KEY])
                        await asyncio.Event().wait()  # until the loop cancels it
                except Exception as exc:
                    if not ready.done():
                        ready.set_exception(exc)
                    raise

            self._holder = loop.create_task(hold())
        return await asyncio.shield(ready)
