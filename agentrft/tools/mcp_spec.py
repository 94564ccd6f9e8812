"""The job's MCP servers (`agentrft: {mcp_servers: [...]}`): where a job's tools can come from
besides HTTP endpoints and Python callables. Config only; no MCP SDK import here, so a job
loads fast and the client (`agentrft.tools.mcp`) loads only where a run calls tools.

    mcp_servers:
      - {url: https://tools.example.com/mcp, headers: {Authorization: ...}, tools: [lookup]}
      - {url: /mcp}                      # the job's environment server (agentrft.environment)
      - {command: [python, server.py], env: {TOKEN: ...}}   # stdio: one process per rollout

Every rollout opens its own MCP session and sends its `trace_id` in each call's `_meta`
(`{"trace_id", "item"}`) and, over HTTP, in the `TRACE_HEADER` header too.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, model_validator

from agentrft.config import Strict

TRACE_HEADER = "X-Agentrft-Trace-Id"  # the rollout's trace_id, on every MCP request over HTTP


class McpServer(Strict):
    """One MCP server: streamable HTTP (`url`) or stdio (`command`, started and stopped by
    agentrft for each rollout). `tools` is an allow-list; unset, every listed tool is used."""

    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)  # stdio: extra variables for the server
    cwd: str = "."  # stdio: where it starts, relative to the job file
    tools: list[str] | None = None
    timeout_s: float | None = Field(default=None, gt=0)  # per call; default agentrft.tool_timeout_s
    startup_timeout_s: float = Field(default=30.0, gt=0)  # connect + handshake + tools/list

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.url is None) == (self.command is None):
            raise ValueError(
                "an MCP server needs exactly one of `url` (streamable HTTP) or `command` "
                "(a stdio server agentrft starts, e.g. [python, server.py])"
            )
        if self.url is not None:
            if not self.url.startswith("/") and urlsplit(self.url).scheme not in ("http", "https"):
                raise ValueError(
                    f"MCP server url {self.url!r}: use http(s)://host/path, or a bare path such "
                    "as /mcp on the job's environment server"
                )
        elif self.headers:
            raise ValueError(
                "`headers` are sent over HTTP; a stdio server (`command`) takes `env` instead"
            )
        if self.tools is not None and len(set(self.tools)) != len(self.tools):
            raise ValueError("`tools` lists a name twice")
        return self

    @property
    def label(self) -> str:
        """How messages name this server (a URL is redacted by whoever prints it)."""
        return self.url if self.url is not None else " ".join(self.command or [])
