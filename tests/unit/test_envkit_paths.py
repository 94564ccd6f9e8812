"""Paths a model names inside an envkit workspace: a symlink loop or an over-long name is
the model's mistake, answered 400 and shown to it, not a 500 that is retried and then
discards the rollout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrft.tools.envkit import ToolInputError, ToolServer, confined, serve_in_thread


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "ok.txt").write_text("fine")
    os.symlink("b", tmp_path / "a")  # a -> b -> a
    os.symlink("a", tmp_path / "b")
    return tmp_path


def call(url: str, path: str) -> httpx.Response:
    return httpx.post(
        f"{url}/tools/read",
        json={
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read",
            "arguments": f'{{"path": "{path}"}}',
            "trace_id": "trace_p",
            "item": {},
        },
    )


def test_symlink_loops_and_long_names_are_a_400_for_the_model(workspace: Path) -> None:
    env = ToolServer("paths")

    @env.tool
    def read(ctx: Any, path: str) -> str:
        return (workspace / path).resolve().read_text()  # a tool written without care for loops

    with serve_in_thread(env.app) as url:
        ok = call(url, "ok.txt")
        loop = call(url, "a")
        long = call(url, "x" * 5000)
    assert ok.status_code == 200
    assert loop.status_code == 400, loop.text
    assert "loop" in loop.text.lower() and "try another path" in loop.text
    assert long.status_code == 400, long.text
    assert "too long" in long.text


def test_confined_resolves_inside_the_workspace_or_says_why_not(workspace: Path) -> None:
    assert confined(workspace, "ok.txt") == (workspace / "ok.txt").resolve()
    with pytest.raises(ToolInputError, match="loop"):
        confined(workspace, "a/more")
    with pytest.raises(ToolInputError, match="outside"):
        confined(workspace, "../elsewhere")
    with pytest.raises(ToolInputError, match="absolute"):
        confined(workspace, "/etc/passwd")
