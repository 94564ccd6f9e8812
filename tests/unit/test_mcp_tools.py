"""Tools from MCP servers, end to end through the rollout engine, against real MCP servers on
loopback: envkit's /mcp route (the SDK's streamable-HTTP server) and a stdio server built with
the SDK's `MCPServer`. Listing, calls, errors the model sees, per-rollout isolation, discards
when a server fails, stdio processes started and reaped, secrets kept out of discard reasons."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from agentrft.errors import ConfigError
from agentrft.job import job_from_dict
from agentrft.policy import SamplingParams
from agentrft.redact import REDACTED, redact_job
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import run_groups
from agentrft.tools.envkit import ToolInputError, ToolServer, serve_in_thread
from agentrft.tools.mcp import mcp_tools
from agentrft.tools.mcp_spec import McpServer
from agentrft.types import Item, StopReason
from tests.unit.pytools import call, module_server

SEEN: list[dict] = []
_lock = threading.Lock()
env = ToolServer("mcp-test-tools")
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@env.tool(parameters=TEXT, description="Remember a note for this rollout.")
def remember(ctx, text: str) -> str:
    ctx.state.setdefault("notes", []).append(text)
    with _lock:
        SEEN.append({"trace_id": ctx.trace_id, "item": ctx.item, "headers": ctx.headers})
    return f"{ctx.trace_id}:{','.join(ctx.state['notes'])}"


@env.tool
def reject(ctx) -> str:
    raise ToolInputError("no such record: try another id")


@env.tool
def broken(ctx) -> str:
    with _lock:
        SEEN.append({"trace_id": ctx.trace_id, "broken": True})
    raise RuntimeError("backend down")


server = module_server(env.app)


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


def listed(servers, retries=3, timeout_s=5.0):
    return mcp_tools(servers, timeout_s=timeout_s, retries=retries, backoff_s=0.01)


def rollout(tools, tokenizer, replies, n=1, rows=1):
    from tests.conftest import ScriptedPolicy

    rs = RolloutSettings(
        renderer=ChatRenderer(tokenizer, [t.spec for t in tools.values()]), tools=tools
    )
    items = [
        Item(i, ({"role": "user", "content": f"task {i}"},), {"row": i}, f"t:{i}")
        for i in range(rows)
    ]
    policy = ScriptedPolicy(tokenizer, replies)
    groups = run_groups(items, n, rs, policy, SamplingParams(max_tokens=200))
    return [t for g in groups for t in g.trajectories]


def test_tools_are_listed_with_their_schemas_and_filtered_by_the_allow_list(server):
    tools = listed([McpServer(url=server + "/mcp")])
    assert set(tools) == {"remember", "reject", "broken"}
    assert tools["remember"].spec.parameters == TEXT
    assert tools["remember"].spec.description == "Remember a note for this rollout."
    assert set(listed([McpServer(url=server + "/mcp", tools=["remember"])])) == {"remember"}
    with pytest.raises(ConfigError, match=r"no tool 'nope'.*allow-list"):
        listed([McpServer(url=server + "/mcp", tools=["nope"])])


def test_a_call_carries_the_trace_id_item_and_headers_and_its_output_reaches_the_model(
    server, tokenizer
):
    tools = listed([McpServer(url=server + "/mcp", headers={"Authorization": "Bearer k-123"})])
    (traj,) = rollout(
        tools, tokenizer, [call("remember", text="a"), call("remember", text="b"), "done"]
    )
    assert traj.stop_reason == StopReason.FINAL_ANSWER and traj.discarded is None
    outputs = [r.output for turn in traj.turns for r in turn.tool_results]
    assert outputs == [f"{traj.trace_id}:a", f"{traj.trace_id}:a,b"]  # the state carried over
    assert f"{traj.trace_id}:a,b" in tokenizer.decode(list(traj.tokens))
    assert [s["trace_id"] for s in SEEN] == [traj.trace_id] * 2
    assert SEEN[0]["item"] == {"row": 0}
    assert SEEN[0]["headers"]["authorization"] == "Bearer k-123"
    assert SEEN[0]["headers"]["x-agentrft-trace-id"] == traj.trace_id


def test_a_tool_error_reaches_the_model_as_text(server, tokenizer):
    tools = listed([McpServer(url=server + "/mcp")])
    (traj,) = rollout(tools, tokenizer, [call("reject"), "ok"])
    result = traj.turns[0].tool_results[0]
    assert result.status == "client_error"
    assert result.output == "Error: no such record: try another id"
    assert "no such record" in tokenizer.decode(list(traj.tokens))
    assert traj.discarded is None and traj.stop_reason == StopReason.FINAL_ANSWER


def test_16_concurrent_rollouts_each_see_only_their_own_state(server, tokenizer):
    tools = listed([McpServer(url=server + "/mcp")])
    trajs = rollout(
        tools, tokenizer, [call("remember", text="x"), call("remember", text="y"), "done"], n=16
    )
    assert len({t.trace_id for t in trajs}) == 16
    for t in trajs:
        outputs = [r.output for turn in t.turns for r in turn.tool_results]
        assert outputs == [f"{t.trace_id}:x", f"{t.trace_id}:x,y"]
    assert sorted(s["trace_id"] for s in SEEN) == sorted([t.trace_id for t in trajs] * 2)


def test_a_failing_server_discards_the_rollout_after_retries(server, tokenizer):
    tools = listed([McpServer(url=server + "/mcp")], retries=2)
    trajs = rollout(tools, tokenizer, [call("broken"), "never reached"], n=2)
    assert all(t.stop_reason == StopReason.TOOL_ERROR for t in trajs)
    assert all(t.discarded and "after 3 attempts" in t.discarded for t in trajs)
    assert len(SEEN) == 6  # first attempt + 2 retries, per rollout


def test_a_server_gone_mid_run_discards_with_the_url_redacted(tokenizer):
    with serve_in_thread(env.app) as url:
        secret_url = url.replace("http://", "http://user:pw@") + "/mcp?key=sekrit"
        tools = listed([McpServer(url=secret_url, headers={"Authorization": "Bearer hdr"})], 1)
    (traj,) = rollout(tools, tokenizer, [call("remember", text="a"), "never reached"])
    assert traj.stop_reason == StopReason.TOOL_ERROR and traj.discarded
    assert "remember" in traj.discarded
    for secret in ("pw", "sekrit", "hdr"):
        assert secret not in traj.discarded


@pytest.fixture(scope="module")
def stdio(tmp_path_factory):
    """A stdio server's tools, listed once (one process), and the folder its pids land in."""
    pids = tmp_path_factory.mktemp("pids")
    script = Path(__file__).with_name("mcp_stdio_server.py")
    server = McpServer(
        command=[sys.executable, str(script)], env={"PID_DIR": str(pids), "TOKEN": "t0k"}
    )
    return listed([server]), pids


def _pids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir()}


def _alive(pid: int) -> bool:
    """True while the process exists, zombies included (a zombie was not reaped)."""
    return Path(f"/proc/{pid}").exists()


def test_a_stdio_server_runs_once_per_rollout_and_is_stopped_and_reaped(stdio, tokenizer):
    tools, folder = stdio
    assert set(tools) == {"note", "crash"}
    before = _pids(folder)
    trajs = rollout(tools, tokenizer, [call("note", text="a"), call("note", text="b"), "done"], 2)
    for t in trajs:  # each rollout had its own process, so its own notes
        assert [r.output for turn in t.turns for r in turn.tool_results] == ["a", "a,b"]
    assert len(_pids(folder) - before) == 2
    assert {p.read_text() for p in folder.iterdir()} == {"t0k"}  # its env arrived
    assert not any(_alive(pid) for pid in _pids(folder))


def test_a_stdio_server_that_crashes_mid_rollout_discards_it(stdio, tokenizer):
    tools, folder = stdio
    (traj,) = rollout(tools, tokenizer, [call("note", text="a"), call("crash"), "never reached"])
    assert traj.stop_reason == StopReason.TOOL_ERROR
    assert traj.discarded and "crash" in traj.discarded and "after 1 attempts" in traj.discarded
    assert traj.turns[0].tool_results[0].output == "a"
    assert not any(_alive(pid) for pid in _pids(folder))


def job(**ext):
    return {
        "training_file": "t.jsonl",
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "string_check",
                    "name": "g",
                    "input": "{{sample.output_text}}",
                    "reference": "x",
                    "operation": "eq",
                }
            },
        },
        "agentrft": ext,
    }


def test_the_job_field_is_validated_with_the_field_and_the_fix():
    with pytest.raises(ConfigError, match=r"agentrft\.mcp_servers\.0.*exactly one of `url`"):
        job_from_dict(job(mcp_servers=[{"tools": ["a"]}]))
    with pytest.raises(ConfigError, match=r"mcp_servers\.0.*http\(s\)"):
        job_from_dict(job(mcp_servers=[{"url": "ftp://x/mcp"}]))
    with pytest.raises(ConfigError, match=r"mcp_servers\.0\.tols.*spelling"):
        job_from_dict(job(mcp_servers=[{"url": "http://x/mcp", "tols": []}]))
    j = job_from_dict(job(mcp_servers=[{"url": "/mcp", "tools": ["remember"]}]))
    from agentrft.runtime import tools_from_job

    with pytest.raises(ConfigError, match=r"bare path.*agentrft.environment"):
        tools_from_job(j)


def test_a_name_shared_with_a_job_tool_is_refused(server):
    with pytest.raises(ConfigError, match=r"'remember'.*also defined by the job's `tools`"):
        mcp_tools(
            [McpServer(url=server + "/mcp")],
            timeout_s=1,
            retries=0,
            backoff_s=0,
            taken=["remember"],
        )


def test_secrets_of_mcp_servers_are_redacted_where_a_job_is_written():
    data = job(
        mcp_servers=[
            {
                "url": "https://u:p@tools.example.com/mcp?k=v",
                "headers": {"Authorization": "Bearer s"},
            },
            {"command": ["srv"], "env": {"TOKEN": "t"}},
        ]
    )
    out = json.dumps(redact_job(data))
    for secret in ("Bearer s", '"t"', "u:p", "=v"):
        assert secret not in out
    assert out.count(REDACTED) >= 4
