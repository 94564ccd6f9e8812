"""Testing a recipe's environment over loopback HTTP: a fresh copy of its env.py, and tool
calls POSTed in the OpenAI Agent RFT shape."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx


def load_fresh(env_py: Path) -> ModuleType:
    """A new copy of the module at `env_py` (its own ToolServer, no state shared with other
    copies)."""
    spec = importlib.util.spec_from_file_location(
        f"{env_py.parent.name}_env_{uuid.uuid4().hex}", env_py
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def post_tool_call(
    client: httpx.Client, trace_id: str, item: dict[str, Any], name: str, **arguments: Any
) -> httpx.Response:
    """POST one call of tool `name` to the client's server, as a rollout sends it."""
    body = {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex[:8]}",
        "call_id": f"call_{uuid.uuid4().hex[:8]}",
        "name": name,
        "arguments": json.dumps(arguments),
        "trace_id": trace_id,
        "item": item,
    }
    return client.post(f"/tools/{name}", json=body)
