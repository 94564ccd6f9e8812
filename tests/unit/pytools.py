"""In-process tools used by the tool tests (`function: "tests.unit.pytools:add"`), and what
the HTTP and MCP tool tests share: a tool server fixture and the text of a model's call."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentrft.tools.envkit import serve_in_thread

CALLS: list[str] = []


def add(a: float, b: float) -> float:
    CALLS.append("add")
    return a + b if (a + b) != int(a + b) else int(a + b)


def whoami(trace_id: str, item: dict) -> dict:
    CALLS.append("whoami")
    return {"trace_id": trace_id, "item": item}


def fragile() -> str:
    CALLS.append("fragile")
    raise RuntimeError("database unreachable")


COUNTRIES = {"peru": "capital: Lima", "norway": "capital: Oslo"}


def lookup(country: str) -> str:
    """Facts about a country; an unknown one is the caller's mistake (the 4xx path)."""
    from agentrft.tools import ToolInputError

    CALLS.append("lookup")
    if country.lower() not in COUNTRIES:
        raise ToolInputError(f"unknown country {country!r}")
    return COUNTRIES[country.lower()]


def module_server(app: Any) -> Callable[[], Iterator[str]]:
    """A module-scoped `server` fixture: `app` (an envkit ToolServer's app) on loopback."""

    @pytest.fixture(scope="module")
    def server() -> Iterator[str]:
        with serve_in_thread(app) as url:
            yield url

    return server


def call(name: str, **args: Any) -> str:
    """The text of one tool call as the model writes it."""
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'
