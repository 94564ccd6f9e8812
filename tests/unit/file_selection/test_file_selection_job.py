"""The file-selection recipe's job: it loads, its tools are exactly what env.py serves, its
few-shot examples parse, and its environment launches the way a run starts it."""

from __future__ import annotations

import json

import httpx

from agentrft.job import load_job
from agentrft.policy.tool_format import parse_reply
from agentrft.tools.launch import launch_environment


def test_job_tools_match_the_environment(load_env_module, recipe):
    job = load_job(recipe / "job.yaml")
    served = {s["name"]: s for s in load_env_module().env.tool_specs()}
    assert [t.name for t in job.rl.tools] == list(served)
    for tool in job.rl.tools:
        assert tool.server_url == f"/tools/{tool.name}"
        assert tool.parameters == served[tool.name]["parameters"], tool.name
        assert tool.description == served[tool.name]["description"], tool.name
    f1 = json.loads((recipe / "grader.json").read_text())  # the metric the recipe reports
    assert job.rl.grader["type"] == "multi" and job.rl.grader["graders"]["files"] == f1
    assert job.agentrft.environment is not None and job.agentrft.environment.app == "env:app"


def test_few_shot_examples_parse_and_take_arguments_from_the_request(load_env_module, recipe):
    job = load_job(recipe / "job.yaml")
    schemas = {t.name: t.parameters for t in job.rl.tools}
    env = load_env_module()
    shots = job.agentrft.few_shot_messages
    calls = answers = 0
    for i, message in enumerate(shots):
        if message["role"] != "assistant":
            continue
        reply = parse_reply(message["content"], schemas)
        if reply.calls:
            (call,) = reply.calls
            assert call.error is None, call.error
            request = shots[i - 1]["content"].lower()
            assert all(str(v).lower() in request for v in json.loads(call.arguments).values() if isinstance(v, str))
            calls += 1
        else:
            assert env.parse_paths(reply.text), reply.text
            answers += 1
    assert calls == answers == 2


def test_environment_launches_and_removes_workspaces_on_exit(make_repo, tmp_path, recipe):
    r = make_repo()
    r.write("a.txt", "hello\n")
    parent = r.commit("root")
    r.write("a.txt", "bye\n")
    head = r.commit("change")
    item = {"repo": str(r.path), "commit": head, "parent": parent, "files": ["a.txt"]}
    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    with launch_environment("env:app", recipe, env={"AGENTRFT_WORKSPACE_DIR": str(workspaces)}) as url:
        body = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
                "arguments": json.dumps({"path": "a.txt"}), "trace_id": "trace_launch", "item": item}
        resp = httpx.post(f"{url}/tools/read_file", json=body, timeout=30)
        assert resp.json()["output"] == "1: hello"
        assert len(list(workspaces.iterdir())) == 1
    assert list(workspaces.iterdir()) == []  # the server removed open workspaces as it stopped
