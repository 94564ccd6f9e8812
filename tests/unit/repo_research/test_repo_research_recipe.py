"""The repository-research recipe: its environment serves the row's commit and nothing outside
it, its jobs offer exactly the tools the environment serves, and its grader pays for facts
stated in a short answer, not for pasted files or tool output, under either tool budget."""

from __future__ import annotations

import httpx
import pytest

from agentrft.graders import build_grader, tool_call_limit
from agentrft.job import load_job
from agentrft.tools.envkit import serve_in_thread
from tests.unit.recipe_env import post_tool_call

from .conftest import MODULES, RECIPE

JOBS = ["job.yaml", "job_cliff.yaml"]


@pytest.fixture
def item(py_repo, tmp_path, monkeypatch) -> dict:
    repo, commit = py_repo
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not read\n")
    monkeypatch.setenv("AGENTRFT_WORKSPACE_DIR", str(tmp_path / "ws"))
    (tmp_path / "ws").mkdir()
    return {
        "repo": str(repo),
        "commit": commit,
        "facts": ["pkg/config.py"],
        "kind": "where_defined",
        "source_files": ["pkg/config.py"],
    }


@pytest.fixture
def server(load_env_module):
    with (
        serve_in_thread(load_env_module().app) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


def call(
    client: httpx.Client, item: dict, name: str, trace_id: str = "t", **arguments
) -> httpx.Response:
    return post_tool_call(client, trace_id, item, name, **arguments)


def ok(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.json()["output"]


# -- environment ---------------------------------------------------------------------------
def test_tools_see_the_rows_commit_only(server, item, tmp_path):
    listing = ok(call(server, item, "list_files"))
    assert (
        "pkg/config.py" in listing and "pkg/late.py" not in listing
    )  # added after the row's commit
    assert ".git" not in listing
    assert ok(call(server, item, "grep", pattern="late_function")).startswith("no matches")
    assert ok(call(server, item, "search", query="late function")).startswith("no files match")
    assert (
        ok(call(server, item, "read_file", path="pkg/config.py", end_line=1))
        == "1: import json\n... (11 lines in all; continue with start_line=2)"
    )
    (ws,) = (tmp_path / "ws").iterdir()
    assert not (ws / ".git").exists()


@pytest.mark.parametrize(
    "tool,args",
    [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "pkg/../../outside/secret.txt"}),
        ("list_files", {"path": ".."}),
        ("grep", {"pattern": "do not", "path": "../outside"}),
    ],
)
def test_paths_outside_the_workspace_are_refused(server, item, tool, args):
    resp = call(server, item, tool, **args)
    assert resp.status_code == 400, resp.text
    assert "do not read" not in resp.text


def test_cleanup_removes_the_workspace_and_a_bad_item_is_the_servers_fault(server, item, tmp_path):
    ok(call(server, item, "list_files", trace_id="c"))
    assert server.post("/cleanup", json={"trace_id": "c"}).json() == {"removed": True}
    assert list((tmp_path / "ws").iterdir()) == []
    assert (
        call(server, {**item, "commit": "HEAD; rm -rf /"}, "list_files", trace_id="d").status_code
        == 500
    )


@pytest.mark.parametrize("variant", JOBS)
def test_job_tools_match_the_environment(load_env_module, variant):
    job = load_job(RECIPE / variant)
    served = {s["name"]: s for s in load_env_module().env.tool_specs()}
    assert {t.name for t in job.rl.tools} == set(served)
    for tool in job.rl.tools:
        assert tool.server_url == f"/tools/{tool.name}"
        assert (
            tool.parameters == served[tool.name]["parameters"]
            and tool.description == served[tool.name]["description"]
        )
    assert job.agentrft.environment is not None and job.agentrft.environment.app == "env:app"


# -- grader: the pinned hacks and both budgets ------------------------------------------------
def grade(variant: str, answer: str, facts: list[str], n_calls: int = 1) -> float:
    grader = build_grader(load_job(RECIPE / variant).rl.grader)
    calls = [
        {"name": "grep", "arguments": {"pattern": "x"}, "output": "", "status": "ok"}
    ] * n_calls
    return grader.grade({"output_text": answer, "tool_calls": calls}, {"facts": facts}).score


@pytest.mark.parametrize("variant", JOBS)
def test_a_short_answer_stating_the_facts_scores_full(variant):
    assert grade(variant, "`load_settings` is defined in pkg/config.py.", ["pkg/config.py"]) == 1.0
    assert grade(variant, "It raises ValueError.", ["ValueError", "KeyError"]) == 0.5
    assert grade(variant, "It is in pkg/net.py.", ["pkg/config.py"]) == 0.0


@pytest.mark.parametrize("variant", JOBS)
def test_dumping_a_whole_file_into_the_answer_does_not_pay(variant):
    text = MODULES["pkg/config.py"]
    facts = ["dict[str, int]", "ValueError", "3", "load_settings"]
    assert all(f in text for f in facts)  # the dump does state every fact
    assert grade(variant, text, facts) == 0.0


@pytest.mark.parametrize("variant", JOBS)
def test_pasting_tool_output_does_not_pay(variant):
    search_output = "\n".join(
        f"{n}. {p}  (matches: settings, load)"
        for n, p in enumerate(
            ["pkg/net.py", "pkg/config.py", "pkg/store.py", "tools/cli.py", "pkg/__init__.py"],
            start=1,
        )
    )
    grep_output = "\n".join(
        f"pkg/mod{i}.py:{i}: def load_settings{i}(path, retries=3):" for i in range(20)
    )
    listing = "\n".join(
        f"pkg/sub{i}/module_{i}.py" for i in range(10)
    )  # a list_files page of ten paths
    for pasted in (search_output, grep_output, listing + "\npkg/config.py"):
        assert grade(variant, pasted, ["pkg/config.py"]) == 0.0, pasted


@pytest.mark.parametrize("variant", ["job.yaml", "job_cliff.yaml"])
def test_a_short_list_of_candidate_paths_pays_only_its_share(variant):
    """Three candidates fit under the word cap; path_precision pays the right one a third."""
    assert grade(variant, "pkg/net.py, pkg/config.py or pkg/store.py", ["pkg/config.py"]) == (
        pytest.approx(1 / 3)
    )
    assert grade(variant, "It is defined in pkg/config.py.", ["pkg/config.py"]) == 1.0
    both = ["pkg/a.py", "pkg/b.py"]  # an imports question: stating exactly its files pays in full
    assert grade(variant, "Imported by: pkg/a.py, pkg/b.py.", both) == 1.0
    assert grade(variant, "pkg/a.py, pkg/b.py, pkg/c.py, pkg/d.py", both) == 0.5


def test_the_soft_budget_costs_per_call_past_the_free_ones():
    right = "It is defined in pkg/config.py."
    assert (
        tool_call_limit(build_grader(load_job(RECIPE / "job.yaml").rl.grader)) is None
    )  # no cliff: rollouts are not cut
    assert [grade("job.yaml", right, ["pkg/config.py"], n) for n in (0, 2, 3, 6)] == pytest.approx(
        [1.0, 1.0, 0.95, 0.8]
    )
    assert grade("job.yaml", "no idea", ["pkg/config.py"], 6) == pytest.approx(
        -0.2
    )  # calling more never pays by itself


def test_the_hard_budget_is_a_cliff_past_its_calls():
    right = "It is defined in pkg/config.py."
    assert (
        tool_call_limit(build_grader(load_job(RECIPE / "job_cliff.yaml").rl.grader)) == 3
    )  # rollouts stop at the 4th call
    assert [grade("job_cliff.yaml", right, ["pkg/config.py"], n) for n in (0, 3, 4, 9)] == [
        1.0,
        1.0,
        -1.0,
        -1.0,
    ]


def test_recipe_files_exist():
    for name in ("env.py", "job.yaml", "job_cliff.yaml"):
        assert (RECIPE / name).is_file(), name


def test_a_budget_must_say_which_way_and_both_ways_combine():
    facts = {"type": "fact_recall", "reference": "{{item.facts}}"}
    with pytest.raises(Exception, match="max_tool_calls .* or cost_per_call"):
        build_grader({"type": "tool_budget", "grader": facts})
    both = build_grader(
        {
            "type": "tool_budget",
            "max_tool_calls": 4,
            "cost_per_call": 0.1,
            "free_calls": 1,
            "grader": facts,
        }
    )
    calls = [{"name": "grep", "arguments": {}}]
    scores = [
        both.grade(
            {"output_text": "pkg/config.py", "tool_calls": calls * n}, {"facts": ["pkg/config.py"]}
        ).score
        for n in (1, 3, 5)
    ]
    assert scores == pytest.approx([1.0, 0.8, -1.0])
    assert tool_call_limit(both) == 4
