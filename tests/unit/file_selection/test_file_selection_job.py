"""The file-selection recipe's job: it loads, its tools are exactly what env.py serves, its
few-shot examples parse, and its environment launches the way a run starts it."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrft.graders import build_grader, sample_from_text
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


def _answer_after_grep(answer: str, grep_output: str, status: str = "ok") -> dict:
    sample = sample_from_text(answer)
    sample["tool_calls"] = [{"call_id": "call_1", "name": "grep", "arguments": {"pattern": "x", "files_only": True},
                             "output": grep_output, "status": status, "error": None}]
    return sample


def test_partial_credit_is_only_for_paths_the_rollout_found_itself(recipe):
    """The reward: 0.6 x F1 + 0.4 x `found`, a soft F1 over the paths the rollout's own tool
    calls returned. Each hack below is one a model can find: copying the worked examples'
    paths (they share folders with most changes), copying the tool's "no matches" message
    (what a first version of this grader paid for), copying every search result."""
    grader = build_grader(load_job(recipe / "job.yaml").rl.grader)
    item = {"files": ["agentrft/policy/load.py"]}
    results = "agentrft/policy/load.py\nagentrft/types.py\ndocs/policy.md"

    def score(answer: str, output: str = results, status: str = "ok") -> float:
        grade = grader.grade(_answer_after_grep(answer, output, status), item)
        assert grade.error is None, grade.error
        return grade.score

    assert score('["agentrft/policy/load.py"]') == pytest.approx(1.0)
    near = score('["agentrft/types.py"]')  # right folder, wrong file, found by the search
    assert 0.0 < near < 0.4
    assert score('["agentrft/types.py", "tests/unit/test_rollout_engine.py"]', "docs/policy.md") == 0.0  # the examples'
    assert score('["agentrft/types.py"]', status="client_error") == 0.0  # an error message is not a search result
    message = "no matches for 'rfu' under '.'"
    assert score(json.dumps([message]), message) == 0.0
    many = "\n".join(["agentrft/types.py"] + [f"agentrft/mod{i}.py" for i in range(19)])
    spray = score(json.dumps(many.splitlines()), many)
    assert 0.0 < spray < near  # every result copied: diluted precision
    assert score('["agentrft/types.py", "made/up.py"]') < near  # a path not found counts as a miss


def test_every_variant_in_the_readme_table_loads(recipe):
    variants = sorted(recipe.glob("job*.yaml"))
    assert len(variants) >= 8
    for path in variants:
        build_grader(load_job(path).rl.grader)  # raises on a bad job or grader
