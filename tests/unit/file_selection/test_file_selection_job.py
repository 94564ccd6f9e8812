"""The file-selection recipe's job: it loads, its tools are exactly what env.py serves, its
few-shot examples parse, and its environment launches the way a run starts it."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrft.graders import build_grader, sample_from_text
from agentrft.job import load_job
from agentrft.policy.tool_format import parse_reply
from agentrft.tasks.file_selection.dataset import build_dataset
from agentrft.tools.env_token import with_env_token
from agentrft.tools.launch import launch_environment


@pytest.mark.parametrize("variant", ["job.yaml", *[f"history/job_v{i}.yaml" for i in range(10)]])
def test_job_tools_match_the_environment(load_env_module, recipe, variant):
    """Every runnable job (the recipe's and each earlier variant) asks for tools exactly as
    env.py serves them: a job may offer fewer tools than the server has, never other ones."""
    job = load_job(recipe / variant)
    served = {s["name"]: s for s in load_env_module().env.tool_specs()}
    assert {t.name for t in job.rl.tools} <= set(served)
    for tool in job.rl.tools:
        assert tool.server_url == f"/tools/{tool.name}"
        params = served[tool.name]["parameters"]
        assert set(tool.parameters["properties"]) <= set(params["properties"]), tool.name
        assert set(tool.parameters.get("required", [])) >= set(params.get("required", [])), (
            tool.name
        )
        if variant == "job.yaml":  # the earlier variants' text stays as it was measured
            assert tool.parameters == params, tool.name
            assert tool.description == served[tool.name]["description"], tool.name
    if variant != "job.yaml":
        return
    f1 = json.loads((recipe / "grader.json").read_text())  # the metric the recipe reports
    assert job.rl.grader["type"] == "multi" and job.rl.grader["graders"]["files"] == f1
    assert job.agentrft.environment is not None and job.agentrft.environment.app == "env:app"


def test_worked_examples_in_the_rows_parse_and_answer_from_their_own_search(
    make_repo, tmp_path, recipe
):
    """The job names no path of any repository: its worked examples come from the data builder,
    made from the target repository's own training commits (see test_from_git.py)."""
    job = load_job(recipe / "job.yaml")
    assert not job.agentrft.few_shot_messages
    assert "/" not in (job.agentrft.system_prompt or "")
    schemas = {t.name: t.parameters for t in job.rl.tools}
    r = make_repo()
    r.write("src/login.py", "def check_password(user, password):\n    return True\n")
    r.write("src/invoice.py", "def invoice_total(items):\n    return 0\n")
    r.write("README.md", "A shop.\n")
    r.commit("Initial import")
    for i, (path, message) in enumerate(
        [
            ("src/login.py", "Login: check the password"),
            ("src/invoice.py", "Invoice total: sum the items"),
            ("README.md", "README: say what the shop sells"),
            ("src/login.py", "Login: lock after three tries"),
        ]
    ):
        r.write(path, f"# change {i}\n" + (r.path / path).read_text())
        r.commit(message)
    build_dataset(r.path, tmp_path / "data", val_fraction=0.25)
    row = json.loads((tmp_path / "data" / "val.jsonl").read_text().splitlines()[0])
    shots = row["messages"][:-1]
    assert [m["role"] for m in shots] == ["user", "assistant", "tool", "assistant"] * 2
    grader = build_grader(job.rl.grader)
    for k in range(0, len(shots), 4):
        request, call, output, answer = shots[k : k + 4]
        (parsed,) = parse_reply(call["content"], schemas).calls
        assert parsed.error is None and call["content"].startswith(job.agentrft.prefills[0])
        assert json.loads(parsed.arguments)["query"] in request["content"]
        assert answer["content"].startswith(job.agentrft.prefills[1])
        sample = _answer_after_search(answer["content"], output["content"])
        assert grader.grade(sample, {"files": _files_of(r, request["content"])}).score > 0


def _files_of(repo, message: str) -> list[str]:
    sha = repo.git("log", "--format=%H", "--grep", message.splitlines()[0], "-F", "-n", "1")
    return repo.git("show", "--format=", "--name-only", sha).split()


def test_environment_launches_and_removes_workspaces_on_exit(make_repo, tmp_path, recipe):
    r = make_repo()
    r.write("a.txt", "hello\n")
    parent = r.commit("root")
    r.write("a.txt", "bye\n")
    head = r.commit("change")
    item = {"repo": str(r.path), "commit": head, "parent": parent, "files": ["a.txt"]}
    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    with launch_environment(
        "env:app", recipe, env={"AGENTRFT_WORKSPACE_DIR": str(workspaces)}
    ) as url:
        body = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": json.dumps({"path": "a.txt"}),
            "trace_id": "trace_launch",
            "item": item,
        }
        resp = httpx.post(
            f"{url}/tools/read_file", json=body, headers=with_env_token(url, {}), timeout=30
        )
        assert resp.json()["output"] == "1: hello"
        assert len(list(workspaces.iterdir())) == 1
    assert list(workspaces.iterdir()) == []  # the server removed open workspaces as it stopped


def _answer_after_search(answer: str, output: str, status: str = "ok") -> dict:
    sample = sample_from_text(answer)
    sample["tool_calls"] = [
        {
            "call_id": "call_1",
            "name": "search",
            "arguments": {"query": "x"},
            "output": output,
            "status": status,
            "error": None,
        }
    ]
    return sample


RESULTS = "1. agentrft/policy/load.py  (matches: load)\n2. agentrft/types.py  (matches: load)\n3. docs/policy.md  (matches: load)"


def test_the_reward_is_exact_f1_of_what_the_rollouts_own_search_returned(recipe):
    """The reward is `grounded`: exact file F1, where a right path counts only when this
    rollout's own search returned it, and a number names that line of the search's output.
    Each hack below is one a model can find, or found in earlier variants (README, section 3)."""
    grader = build_grader(load_job(recipe / "job.yaml").rl.grader)
    item = {"files": ["agentrft/policy/load.py", "tests/test_load.py"]}

    def score(
        answer: str, output: str = RESULTS, status: str = "ok", sub: str | None = None
    ) -> float:
        grade = grader.grade(_answer_after_search(answer, output, status), item)
        assert grade.error is None, grade.error
        return grade.sub_scores[sub] if sub else grade.score

    assert score("[1]") == pytest.approx(2 / 3)  # one of two files, nothing wrong: P 1, R 0.5
    assert score('["agentrft/policy/load.py"]') == pytest.approx(2 / 3)  # the path itself works too
    assert score("[2]") == 0.0
    assert score("[1, 1, 1]") == pytest.approx(2 / 3)  # repeats are one selection
    # a worked example's path, or a guess, that this rollout's search did not return earns
    # nothing, even where it is right (the plain F1, reported alongside, counts it)
    assert score('["tests/test_load.py"]') == 0.0 and score(
        '["tests/test_load.py"]', sub="files"
    ) == pytest.approx(2 / 3)
    assert (
        score("[1]", output="no files match 'x'; try other words") == 0.0
    )  # a number with no search behind it
    assert score("[1]", status="client_error") == 0.0  # an error message is not a search result
    assert score("[9]") == 0.0  # no such line
    assert score("[1, 2, 3]") == pytest.approx(0.4)  # every result: diluted (P 1/3, R 1/2)
    assert score("[1, 2, 3]") < score("[1]")
    assert score("1") == pytest.approx(2 / 3)  # a bare number is read too
    assert score("The answer is [1]") < score("[1]")  # words around it are misses


def test_every_earlier_variant_in_the_readme_table_loads(recipe):
    variants = sorted((recipe / "history").glob("job_v*.yaml"))
    assert [p.stem for p in variants] == [f"job_v{i}" for i in range(10)]
    for path in variants:
        job = load_job(path)
        build_grader(job.rl.grader)  # raises on a bad job or grader
        assert job.agentrft.environment is not None
        assert (job.resolve_path(job.agentrft.environment.dir) / "env.py").is_file()
