"""The HTTP tool contract, end to end through the rollout engine, against a real loopback
server: trace ids, item and headers, 4xx, 5xx retries and discards, timeouts, 1 MiB limits,
and concurrency of the calls of one turn."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from agentrft.job import ToolSpec
from agentrft.policy import SamplingParams
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import run_groups
from agentrft.tools import build_tools
from agentrft.tools.envkit import ToolInputError, ToolServer, serve_in_thread
from agentrft.types import Item, StopReason
from tests.unit.pytools import call, module_server

LOG: list[dict] = []
ATTEMPTS: dict[str, int] = {}
_lock = threading.Lock()

env = ToolServer("test-tools")
STR = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@env.tool(parameters=STR)
def echo(ctx, text: str) -> str:
    with _lock:
        LOG.append(
            {
                "tool": "echo",
                "trace_id": ctx.trace_id,
                "item": ctx.item,
                "headers": ctx.headers,
                "text": text,
            }
        )
    return f"echo:{text}"


@env.tool(
    parameters={"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}
)
def sleep(ctx, ms: int) -> str:
    start = time.monotonic()
    time.sleep(ms / 1000)
    with _lock:
        LOG.append(
            {"tool": "sleep", "trace_id": ctx.trace_id, "start": start, "end": time.monotonic()}
        )
    return "slept"


@env.tool
def broken(ctx) -> str:
    with _lock:
        ATTEMPTS[ctx.trace_id] = ATTEMPTS.get(ctx.trace_id, 0) + 1
    raise RuntimeError("backend down")


@env.tool
def reject(ctx) -> str:
    raise ToolInputError("no such record: try another id")


@env.tool(
    parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
)
def big(ctx, n: int) -> str:
    return "x" * n


server = module_server(env.app)


@pytest.fixture(autouse=True)
def _clear():
    LOG.clear()
    ATTEMPTS.clear()


def rollout(
    server,
    tokenizer,
    replies,
    n=1,
    rows=1,
    headers=None,
    timeout_s=5.0,
    retries=3,
    fields=None,
    max_tokens=200,
    **settings,
):
    specs = [ToolSpec(**s) for s in env.tool_specs(server, headers=headers)]
    tools = build_tools(specs, timeout_s=timeout_s, retries=retries, backoff_s=0.01)
    rs = RolloutSettings(renderer=ChatRenderer(tokenizer, specs), tools=tools, **settings)
    items = [
        Item(
            i,
            ({"role": "user", "content": f"task {i}"},),
            fields or {"row": i, "secret": f"s{i}"},
            f"t:{i}",
        )
        for i in range(rows)
    ]
    from tests.conftest import ScriptedPolicy

    policy = ScriptedPolicy(tokenizer, replies)
    groups = run_groups(items, n, rs, policy, SamplingParams(max_tokens=max_tokens))
    return [t for g in groups for t in g.trajectories]


def test_one_trace_id_per_rollout_across_calls_and_distinct_between_rollouts(server, tokenizer):
    trajs = rollout(
        server,
        tokenizer,
        [call("echo", text="a"), call("echo", text="b") + call("echo", text="c"), "done"],
        n=3,
    )
    assert all(t.stop_reason == StopReason.FINAL_ANSWER for t in trajs)
    by_trace: dict[str, list[str]] = {}
    for rec in (r for r in LOG if r["tool"] == "echo"):
        by_trace.setdefault(rec["trace_id"], []).append(rec["text"])
    assert set(by_trace) == {t.trace_id for t in trajs}  # the ids the server saw are the rollouts'
    assert len(by_trace) == 3
    assert all(sorted(texts) == ["a", "b", "c"] for texts in by_trace.values())
    assert all(t.trace_id.startswith("trace_") for t in trajs)


def test_item_and_headers_arrive(server, tokenizer):
    trajs = rollout(
        server, tokenizer, [call("echo", text="x"), "done"], rows=2, headers={"X-Api-Key": "k-123"}
    )
    echoes = [r for r in LOG if r["tool"] == "echo"]
    assert len(echoes) == 2
    items = sorted((r["item"] for r in echoes), key=lambda i: i["row"])
    assert items == [{"row": 0, "secret": "s0"}, {"row": 1, "secret": "s1"}]
    assert all(r["headers"].get("x-api-key") == "k-123" for r in echoes)
    assert trajs[0].turns[0].tool_results[0].output == "echo:x"


def test_4xx_body_reaches_the_model(server, tokenizer):
    (traj,) = rollout(server, tokenizer, [call("reject"), "ok"])
    result = traj.turns[0].tool_results[0]
    assert result.status == "client_error"
    assert result.output == "no such record: try another id"
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"] == "no such record: try another id"
    # and the model saw it: the text is inside the context as tool-output tokens
    assert "no such record" in tokenizer.decode(list(traj.tokens))
    assert traj.discarded is None


def test_5xx_retried_exactly_3_times_then_discarded_and_counted(server, tokenizer):
    from agentrft.rollout.records import summarize

    trajs = rollout(server, tokenizer, [call("broken"), "never reached"], n=2)
    assert all(t.stop_reason == StopReason.TOOL_ERROR for t in trajs)
    assert all(t.discarded and "HTTP 500" in t.discarded for t in trajs)
    assert sorted(ATTEMPTS.values()) == [4, 4]  # the first attempt + 3 retries, per rollout
    summary = summarize(trajs)
    assert summary["discarded"] == 2


def test_timeouts_are_honoured(server, tokenizer):
    t0 = time.monotonic()
    (traj,) = rollout(server, tokenizer, [call("sleep", ms=1500), "done"], timeout_s=0.3, retries=1)
    assert traj.stop_reason == StopReason.TOOL_ERROR
    assert "timed out after 0.3s" in traj.discarded
    assert time.monotonic() - t0 < 1.5 * 2  # two attempts of 0.3 s, not two of 1.5 s


def test_request_over_1mib_is_refused_without_sending(server, tokenizer):
    huge = {
        "max_tokens": 10**7,
        "max_tokens_per_turn": 10**7,
        "max_tokens_per_episode": 10**7,
        "context_window": 10**8,
    }
    (traj,) = rollout(server, tokenizer, [call("echo", text="y" * (1 << 20)), "done"], **huge)
    result = traj.turns[0].tool_results[0]
    assert result.status == "refused" and "over 1 MiB" in result.output
    assert [r for r in LOG if r["tool"] == "echo"] == []  # never reached the server
    assert traj.discarded is None


def test_response_over_1mib_is_refused(server, tokenizer):
    (traj,) = rollout(server, tokenizer, [call("big", n=(1 << 20) + 10), "done"])
    result = traj.turns[0].tool_results[0]
    assert result.status == "refused" and "over 1 MiB" in result.output


def test_server_refuses_bodies_over_1mib_with_413(server):
    import httpx

    body = json.dumps({"trace_id": "t", "arguments": json.dumps({"text": "z" * (1 << 20)})})
    r = httpx.post(
        server + "/tools/echo", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413


def test_parallel_calls_of_one_turn_overlap(server, tokenizer):
    k = 5
    t0 = time.monotonic()
    (traj,) = rollout(server, tokenizer, ["".join(call("sleep", ms=200) for _ in range(k)), "done"])
    assert len(traj.turns[0].tool_results) == k
    tools_s = traj.turns[0].tools_s
    assert tools_s < 0.5 * k * 0.2, f"{k} calls of 200 ms took {tools_s:.2f}s: not concurrent"
    mine = [r for r in LOG if r["tool"] == "sleep" and r["trace_id"] == traj.trace_id]
    starts = sorted(r["start"] for r in mine)
    ends = sorted(r["end"] for r in mine)
    assert starts[-1] < ends[0]  # every call started before any finished
    assert time.monotonic() - t0 < 10


def test_invalid_call_is_shown_to_the_model_not_sent(server, tokenizer):
    (traj,) = rollout(
        server,
        tokenizer,
        ['<tool_call>{"name": "echo", "arguments": {"text": 3}}</tool_call>', "done"],
    )
    result = traj.turns[0].tool_results[0]
    assert result.status == "invalid_call"
    assert "invalid arguments for 'echo'" in result.output
    assert [r for r in LOG if r["tool"] == "echo"] == []


def test_python_tools_share_the_semantics(tokenizer):
    specs = [
        ToolSpec(
            name="add",
            parameters={
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
            function="tests.unit.pytools:add",
        ),
        ToolSpec(name="whoami", function="tests.unit.pytools:whoami"),
        ToolSpec(name="fragile", function="tests.unit.pytools:fragile"),
    ]
    tools = build_tools(specs, timeout_s=5, retries=3, backoff_s=0.01)
    rs = RolloutSettings(renderer=ChatRenderer(tokenizer, specs), tools=tools)
    from tests.conftest import ScriptedPolicy
    from tests.unit import pytools

    pytools.CALLS.clear()
    items = [Item(0, ({"role": "user", "content": "hi"},), {"k": 1}, "t:0")]
    policy = ScriptedPolicy(
        tokenizer, [call("add", a=2, b=3) + call("whoami") + call("add", a="x", b=1), "done"]
    )
    (g,) = run_groups(items, 2, rs, policy, SamplingParams(max_tokens=100))
    for t in g.trajectories:
        outs = [r.output for r in t.turns[0].tool_results]
        assert outs[0] == "5"
        assert outs[1] == f'{{"trace_id": "{t.trace_id}", "item": {{"k": 1}}}}'
        assert outs[2].startswith("Error: invalid arguments")
    policy = ScriptedPolicy(tokenizer, [call("fragile"), "done"])
    (g,) = run_groups(items, 1, rs, policy, SamplingParams(max_tokens=100))
    assert g.trajectories[0].discarded and "RuntimeError" in g.trajectories[0].discarded
    assert pytools.CALLS.count("fragile") == 4


def test_cleanup_endpoint_runs_the_hook():
    removed = []
    kit = ToolServer("c")
    kit.on_start(lambda ctx: ctx.state.setdefault("dir", "ws-" + ctx.trace_id))
    kit.on_cleanup(lambda ctx: removed.append(ctx.state["dir"]))
    kit.tool(lambda ctx: ctx.state["dir"], name="where")

    import httpx

    with serve_in_thread(kit.app) as url:
        body = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "where",
            "arguments": "{}",
            "trace_id": "trace_a",
            "item": {},
        }
        assert httpx.post(url + "/tools/where", json=body).json()["output"] == "ws-trace_a"
        assert kit.active_traces == ["trace_a"]
        assert httpx.post(url + "/cleanup", json={"trace_id": "trace_a"}).json() == {
            "removed": True
        }
    assert removed == ["ws-trace_a"] and kit.active_traces == []


def test_tools_are_picklable(server):
    import pickle

    specs = [ToolSpec(**s) for s in env.tool_specs(server)] + [
        ToolSpec(name="add", function="tests.unit.pytools:add")
    ]
    tools = build_tools(specs, timeout_s=1, retries=1, backoff_s=0)
    again = pickle.loads(pickle.dumps(tools))
    assert set(again) == set(tools)
    asyncio.run(asyncio.sleep(0))
