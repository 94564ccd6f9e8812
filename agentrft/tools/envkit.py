"""Environment-server kit: host your tools (and an endpoint grader) over HTTP with
per-rollout state, speaking the OpenAI Agent RFT wire contract.

    env = ToolServer("files")

    @env.on_start                      # once per trace_id, before its first call
    def start(ctx): ctx.state["dir"] = make_workspace(ctx.item)

    @env.tool(description="Search files", parameters={...})
    def grep(ctx, pattern: str) -> str: ...

    @env.grader                        # POST /grade {sample, item, trace_id} -> {score}
    def grade(ctx, sample, item) -> float: ...

    @env.on_cleanup                    # after grading, on POST /cleanup, when idle too long,
                                       # or when the server stops
    def cleanup(ctx): shutil.rmtree(ctx.state["dir"])

    app = env.app                      # any ASGI server; `agentrft` can launch it for a job

Routes: POST /tools/{name}, POST /grade (and /grade/{name}), POST /cleanup, GET /tools,
GET /health, and /mcp: the same tools over MCP (streamable HTTP, `agentrft.tools.envkit_mcp`),
with per-trace state keyed by the `trace_id` each call carries, shared with the HTTP routes. With a token (`ToolServer(token=...)`, or `AGENTRFT_ENV_TOKEN`, which
agentrft sets when it starts the server for a job), every route but /health answers 401
unless the request carries it in `X-Agentrft-Env-Token`; agentrft sends it (see
agentrft.tools.env_token). Without one, the routes are open to whoever can reach the port.
Raise `ToolInputError` for a 4xx (shown to the model); any other exception is a 500, which
agentrft retries and then discards the rollout. A path the model named that loops through
symlinks or is too long for the file system is the model's mistake too: a 400 that says so
(`confined` resolves a model's path inside a workspace with the same rules). Bodies over
1 MiB get 413.

A trace's state is cleaned up only after a *successful* grade: a grader that raises answers
500 and keeps the state, so agentrft's retry grades the same workspace. A trace already
cleaned up (graded, `/cleanup`, or idle too long) answers 410 to `/grade` and to tools,
which agentrft flags; it never starts a fresh, empty state that would score 0.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import inspect
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from agentrft.tools.env_token import TOKEN_ENV, TOKEN_HEADER
from agentrft.tools.http import MAX_PAYLOAD_BYTES
from agentrft.tools.python import ToolInputError

log = logging.getLogger(__name__)
_FINISHED_KEPT = (
    100_000  # cleaned-up trace ids remembered, so they answer 410 rather than start afresh
)


@dataclass
class TraceContext:
    """Everything a tool knows about the rollout it serves. `state` is yours."""

    trace_id: str
    item: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    last_used: float = field(default_factory=time.monotonic)
    started: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(frozen=True)
class _ToolEntry:
    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]


class ToolServer:
    def __init__(
        self,
        name: str = "agentrft-env",
        *,
        cleanup_after_grade: bool = True,
        idle_ttl_s: float = 3600.0,
        token: str | None = None,
    ) -> None:
        self.name = name
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.cleanup_after_grade = cleanup_after_grade
        self.idle_ttl_s = idle_ttl_s
        self._tools: dict[str, _ToolEntry] = {}
        self._grader: Callable[..., Any] | None = None
        self._named_graders: dict[str, Callable[..., Any]] = {}
        self._on_start: Callable[[TraceContext], Any] | None = None
        self._on_cleanup: Callable[[TraceContext], Any] | None = None
        self._traces: dict[str, TraceContext] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()  # trace_id -> why it was cleaned up
        self._lock = threading.Lock()
        self._app: Any = None

    # -- registration ---------------------------------------------------------------
    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> Any:
        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            tool_name = name or f.__name__
            self._tools[tool_name] = _ToolEntry(
                f,
                tool_name,
                description if description is not None else (inspect.getdoc(f) or ""),
                parameters or {"type": "object", "properties": {}},
            )
            return f

        return register(fn) if fn is not None else register

    def grader(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """The grader at POST /grade; with `name`, one more at POST /grade/{name} (for a
        `multi` whose sub-scores each read the same rollout's state: a gate, then style)."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            if name is None:
                self._grader = f
            else:
                self._named_graders[name] = f
            return f

        return register(fn) if fn is not None else register

    def on_start(self, fn: Callable[[TraceContext], Any]) -> Callable[[TraceContext], Any]:
        self._on_start = fn
        return fn

    def on_cleanup(self, fn: Callable[[TraceContext], Any]) -> Callable[[TraceContext], Any]:
        self._on_cleanup = fn
        return fn

    def tool_specs(
        self, base_url: str = "", headers: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The `tools` entries of a job for this server."""
        return [
            {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "server_url": f"{base_url.rstrip('/')}/tools/{t.name}",
                "headers": dict(headers or {}),
            }
            for t in self._tools.values()
        ]

    # -- per-trace state ----------------------------------------------------------------
    @property
    def active_traces(self) -> list[str]:
        with self._lock:
            return list(self._traces)

    def _context(
        self, trace_id: str, item: dict[str, Any], headers: dict[str, str]
    ) -> TraceContext:
        self._sweep()
        with self._lock:
            ctx = self._traces.get(trace_id)
            if ctx is None:
                if trace_id in self._finished:
                    raise TraceGone(
                        f"trace {trace_id} was already cleaned up ({self._finished[trace_id]}); its state is gone"
                    )
                ctx = self._traces[trace_id] = TraceContext(trace_id, item, headers)
        with ctx.lock:  # concurrent first calls of one trace wait for a single on_start
            if not ctx.started:
                if self._on_start is not None:
                    self._on_start(ctx)
                ctx.started = True
        ctx.last_used = time.monotonic()
        return ctx

    def cleanup(self, trace_id: str, why: str = "cleaned up on request") -> bool:
        with self._lock:
            ctx = self._traces.pop(trace_id, None)
            if ctx is not None:
                self._finished[trace_id] = why
                while len(self._finished) > _FINISHED_KEPT:
                    self._finished.popitem(last=False)
        if ctx is None:
            return False
        if self._on_cleanup is not None and ctx.started:
            with ctx.lock:
                self._on_cleanup(ctx)
        return True

    def close(self) -> None:
        """Clean up every open trace; runs when the server stops (ASGI lifespan shutdown)."""
        for trace_id in self.active_traces:
            self.cleanup(trace_id, "the server stopped")

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [t for t, c in self._traces.items() if now - c.last_used > self.idle_ttl_s]
        for trace_id in stale:
            self.cleanup(trace_id, f"idle for over {self.idle_ttl_s:g}s")

    async def call_tool(
        self,
        name: str,
        args: dict[str, Any],
        trace_id: str,
        item: dict[str, Any],
        headers: dict[str, str],
    ) -> Any:
        """Run tool `name` for `trace_id` (HTTP and MCP alike). Raises ToolInputError for the
        model's mistakes (wrong arguments included), TraceGone, or the tool's own error."""
        entry = self._tools[name]
        try:
            inspect.signature(entry.fn).bind(None, **args)
        except TypeError as exc:  # wrong or missing arguments: the model's mistake
            raise ToolInputError(f"bad arguments for {name!r}: {exc}") from None

        def run() -> Any:
            ctx = self._context(trace_id, item, headers)
            ctx.calls += 1
            return entry.fn(ctx, **args)

        out = await run_in_threadpool(run)
        if inspect.isawaitable(out):
            out = await out
        return out

    # -- HTTP -----------------------------------------------------------------------------
    @property
    def app(self) -> Any:
        if self._app is None:
            self._app = self._build_app()
        return self._app

    def _build_app(self) -> Any:
        from agentrft.tools.envkit_mcp import McpEndpoint

        mcp = McpEndpoint(self)

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
            async with mcp.running() as state:  # this server's own MCP session manager
                yield state
            await run_in_threadpool(self.close)

        app = FastAPI(title=self.name, lifespan=lifespan)
        # the same tools over MCP; an ASGI app as the route's endpoint (Starlette's Route)
        app.router.routes.append(Route("/mcp", mcp, include_in_schema=False))

        @app.middleware("http")
        async def check_token(request: Request, call_next: Callable[..., Any]) -> Any:
            given = request.headers.get(TOKEN_HEADER, "")
            if (
                self.token
                and request.url.path != "/health"
                and not hmac.compare_digest(given.encode(), self.token.encode())
            ):
                return PlainTextResponse(
                    f"{'wrong' if given else 'missing'} {TOKEN_HEADER}: this environment server "
                    f"takes requests only from the agentrft run that started it",
                    status_code=401,
                )
            return await call_next(request)

        async def read_json(request: Request) -> Any:
            declared = request.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > MAX_PAYLOAD_BYTES:
                raise _TooLarge()
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_PAYLOAD_BYTES:
                    raise _TooLarge()
            return json.loads(body)

        @app.exception_handler(_TooLarge)
        async def too_large(request: Request, exc: _TooLarge) -> PlainTextResponse:
            return PlainTextResponse("payload over 1 MiB refused", status_code=413)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"ok": True, "tools": list(self._tools), "active_traces": len(self._traces)}

        @app.get("/tools")
        async def list_tools(request: Request) -> list[dict[str, Any]]:
            return self.tool_specs(str(request.base_url))

        @app.post("/tools/{name}")
        async def call_tool(name: str, request: Request) -> Any:
            try:
                req = await read_json(request)
            except json.JSONDecodeError:
                return PlainTextResponse("request body is not JSON", status_code=400)
            entry = self._tools.get(name)
            if entry is None:
                return PlainTextResponse(
                    f"unknown tool {name!r}; this server has {sorted(self._tools)}", status_code=404
                )
            try:
                args = json.loads(req.get("arguments") or "{}")
                if not isinstance(args, dict):
                    raise ValueError
            except (ValueError, TypeError):
                return PlainTextResponse(
                    "`arguments` must be a JSON object encoded as a string", status_code=400
                )
            trace_id = str(req.get("trace_id") or "")
            if not trace_id:
                return PlainTextResponse("missing trace_id", status_code=400)
            headers = {k.lower(): v for k, v in request.headers.items()}
            try:
                out = await self.call_tool(name, args, trace_id, req.get("item") or {}, headers)
            except ToolInputError as exc:
                return PlainTextResponse(str(exc), status_code=400)
            except TraceGone as exc:
                return PlainTextResponse(str(exc), status_code=410)
            except (OSError, RuntimeError) as exc:
                why = bad_path(exc)
                if why is None:
                    log.exception("tool %s failed for %s", name, trace_id)
                    return PlainTextResponse(
                        f"tool {name!r} failed: {type(exc).__name__}: {exc}", status_code=500
                    )
                return PlainTextResponse(why, status_code=400)
            except Exception as exc:  # the tool's own failure: a 500, which agentrft retries
                log.exception("tool %s failed for %s", name, trace_id)
                return PlainTextResponse(
                    f"tool {name!r} failed: {type(exc).__name__}: {exc}", status_code=500
                )
            text = tool_text(out)
            return JSONResponse(
                {
                    "type": "function_call_output",
                    "call_id": req.get("call_id"),
                    "id": req.get("id"),
                    "output": text,
                }
            )

        @app.post("/grade")
        async def grade(request: Request) -> Any:
            return await grade_with(request, self._grader)

        @app.post("/grade/{name}")
        async def grade_named(name: str, request: Request) -> Any:
            return await grade_with(request, self._named_graders.get(name))

        async def grade_with(request: Request, grader: Callable[..., Any] | None) -> Any:
            if grader is None:
                return PlainTextResponse("this server has no grader", status_code=404)
            try:
                req = await read_json(request)
            except json.JSONDecodeError:
                return PlainTextResponse("request body is not JSON", status_code=400)
            trace_id = str(req.get("trace_id") or "") if isinstance(req, dict) else ""
            if not trace_id:
                return PlainTextResponse("missing trace_id", status_code=400)
            headers = {k.lower(): v for k, v in request.headers.items()}

            def run() -> Any:
                ctx = self._context(trace_id, req.get("item") or {}, headers)
                out = grader(ctx, req.get("sample") or {}, req.get("item") or {})
                if inspect.isawaitable(out):
                    raise TypeError("the grader must be a plain function, not async")
                reply = out if isinstance(out, dict) else {"score": float(out)}
                if (
                    self.cleanup_after_grade
                ):  # only now: a failed grade keeps the state for the retry
                    self.cleanup(trace_id, "graded")
                return reply

            try:
                return await run_in_threadpool(run)
            except TraceGone as exc:
                return PlainTextResponse(str(exc), status_code=410)
            except Exception as exc:  # a 500: agentrft retries on the same, kept state
                log.exception("grader failed for %s", trace_id)
                return PlainTextResponse(
                    f"grader failed: {type(exc).__name__}: {exc}", status_code=500
                )

        @app.post("/cleanup")
        async def cleanup(request: Request) -> dict[str, Any]:
            req = await read_json(request)
            removed = await run_in_threadpool(self.cleanup, str(req.get("trace_id") or ""))
            return {"removed": removed}

        return app


class _TooLarge(Exception):
    pass


def tool_text(out: Any) -> str:
    """A tool's return value as the text the model reads (non-strings as JSON)."""
    return out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)


def bad_path(exc: BaseException) -> str | None:
    """What to tell the model when `exc` came from a path it named that cannot be followed (a
    symlink loop, a name too long), else None: a real failure of the tool."""
    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):
        what = "loops through symbolic links" if exc.errno == errno.ELOOP else "is too long"
        return (
            f"the path {exc.filename!r} {what}; try another path"
            if exc.filename
            else f"a path {what}; try another path"
        )
    if isinstance(exc, RuntimeError) and str(exc).startswith(
        "Symlink loop"
    ):  # pathlib's resolve() before 3.13
        return f"{exc}; try another path"
    return None


def confined(root: Path, path: str) -> Path:
    """`path` (relative, from the model) resolved inside the workspace `root`, or
    ToolInputError saying why not: absolute, outside `root`, a symlink loop or too long."""
    if not isinstance(path, str) or not path:
        raise ToolInputError("`path` must be a non-empty string relative to the workspace root")
    if Path(path).is_absolute():
        raise ToolInputError(f"{path!r} is absolute; paths are relative to the workspace root")
    try:
        full = (root / path).resolve()
    except (OSError, RuntimeError) as exc:
        why = bad_path(exc)
        if why is None:
            raise
        raise ToolInputError(why) from None
    if not full.is_relative_to(root.resolve()):
        raise ToolInputError(f"{path!r} points outside the workspace")
    return full


class TraceGone(Exception):
    """The trace was cleaned up already: answered 410, never graded on a fresh state."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run an ASGI app on loopback in a background thread; yields its base URL and stops it
    on exit. For tests and notebooks; `agentrft` runs job environments as subprocesses."""
    import uvicorn

    port = port or free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on {host}:{port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
