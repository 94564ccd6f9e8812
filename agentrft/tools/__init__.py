"""Tools the model can call: HTTP endpoints (the OpenAI contract) or in-process callables.

A tool is any object with a `name`, a `spec` and
`async __call__(call, trace_id, item, client) -> ToolResult` that raises `ToolUnavailable`
once retries are spent. `client` is the shared pooled `httpx.AsyncClient` of the event loop.
A tool that holds something per rollout (an MCP session, `agentrft.tools.mcp`) also has
`async release(trace_id)`, called by `release_tools` when the rollout ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agentrft.tools.http import HttpTool
from agentrft.tools.python import PythonTool, ToolInputError
from agentrft.types import ToolCall, ToolResult


class Tool(Protocol):
    name: str
    spec: Any

    async def __call__(
        self, call: ToolCall, trace_id: str, item: Mapping[str, Any], client: Any
    ) -> ToolResult: ...


def build_tools(
    specs: list[Any],
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    base_url: str | None = None,
    base_dir: str | None = None,
) -> dict[str, Tool]:
    """Tool objects by name. A `server_url` that is a bare path ("/tools/grep") is joined to
    `base_url`, the environment server agentrft launched for the job."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        if spec.function:
            tools[spec.name] = PythonTool(
                spec, retries=retries, backoff_s=backoff_s, timeout_s=timeout_s, base_dir=base_dir
            )
            continue
        if spec.server_url.startswith("/"):
            if base_url is None:
                from agentrft.errors import ConfigError

                raise ConfigError(
                    f"tool {spec.name!r}: server_url {spec.server_url!r} is a bare path, which needs "
                    "`agentrft.environment` (a server agentrft starts); otherwise give a full http(s) URL"
                )
            spec = spec.model_copy(update={"server_url": base_url.rstrip("/") + spec.server_url})
        tools[spec.name] = HttpTool(spec, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
    return tools


async def release_tools(tools: Mapping[str, Tool], trace_id: str) -> None:
    """Close what a rollout's tools held open for it (an MCP session per server); the
    episode drivers call it once the rollout ends. Tools without `release` hold nothing."""
    for tool in {id(t): t for t in tools.values()}.values():
        release = getattr(tool, "release", None)
        if release is not None:
            await release(trace_id)


__all__ = ["HttpTool", "PythonTool", "Tool", "ToolInputError", "build_tools", "release_tools"]
