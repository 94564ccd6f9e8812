"""A stdio MCP server built with the SDK's own `MCPServer`, for the MCP tool tests: agentrft
starts one per rollout. It writes its pid to $PID_DIR, so a test can check it was reaped."""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("stdio-test")
NOTES: list[str] = []  # this process's state: one rollout's


@server.tool()
def note(text: str) -> str:
    """Remember a note; returns every note this process holds."""
    NOTES.append(text)
    return ",".join(NOTES)


@server.tool()
def crash() -> str:
    """The process dies mid-call."""
    os._exit(3)


if __name__ == "__main__":
    Path(os.environ["PID_DIR"], str(os.getpid())).write_text(os.environ.get("TOKEN", ""))
    server.run()
