"""The recipe's files agree with each other: the jobs' tools are the environment's, the
grader is a gate on the tests first, and `agentrft demo code_fix` finds the recipe."""

from __future__ import annotations

import json

import pytest

from agentrft.graders import build_grader
from agentrft.job import load_job
from agentrft.tasks import runner as recipes

from .conftest import RECIPE, load_env

REPAIR_TOOLS = {"localize", "candidates", "apply", "revert"}
# the repair job's request already localizes: its calls pick, check and undo candidates
REPAIR_JOB_TOOLS = {"localize", "apply", "run_tests"}


@pytest.mark.parametrize("job_file", ["job.yaml", "job_easy.yaml", "job_repair.yaml"])
def test_the_jobs_tools_are_the_environments(job_file: str) -> None:
    job = load_job(RECIPE / job_file)
    served = {s["name"]: s for s in load_env().env.tool_specs()}
    names = {t.name for t in job.rl.tools}
    # the repair variant tries the listed candidates and runs the tests (localize shows the
    # list again); the others have all but the repair tools
    assert names == (
        REPAIR_JOB_TOOLS if job_file == "job_repair.yaml" else set(served) - REPAIR_TOOLS
    )
    assert names <= set(served)
    for tool in job.rl.tools:
        assert tool.server_url == served[tool.name]["server_url"]
        if job_file == "job_repair.yaml" and tool.name == "run_tests":
            # the task's own tests only: the served tool with its optional selector left out
            assert not served[tool.name]["parameters"].get("required")
            assert tool.parameters == {**served[tool.name]["parameters"], "properties": {}}
            assert "selector" not in tool.description
            continue
        assert tool.parameters == served[tool.name]["parameters"]
        assert tool.description == served[tool.name]["description"]


@pytest.mark.parametrize("job_file", ["job.yaml", "job_easy.yaml", "job_repair.yaml"])
def test_the_grader_gates_on_the_tests_then_style_then_the_bonus(job_file: str) -> None:
    spec = load_job(RECIPE / job_file).rl.grader
    assert spec["type"] == "multi"
    budget = ["budget"] if job_file == "job_repair.yaml" else []
    assert list(spec["graders"]) == ["tests", "style", "validated", *budget]
    # a failing repair rollout pays its calls' cost below 0; nothing above 0 without the tests
    on_fail = "budget - 1" if job_file == "job_repair.yaml" else 0
    assert spec["gate"] == {"grader": "tests", "threshold": 1, "on_fail": on_fail}
    port = load_job(RECIPE / job_file).agentrft.environment.port
    for name, sub in spec["graders"].items():
        if name == "budget":  # behind the gate: a factor of the passing score
            assert sub["type"] == "tool_budget" and "* budget" in spec["calculate_output"]
            continue
        assert sub["type"] == "endpoint"
        assert sub["url"].startswith(f"http://127.0.0.1:{port}/grade")
    build_grader(spec)


def test_the_demo_is_a_recipe() -> None:
    assert "code_fix" in recipes.available()
    demo = recipes.load("code_fix")
    assert callable(demo.run) and callable(demo.run_seeds)


def test_the_demo_moves_the_environment_and_graders_to_one_free_port(tmp_path) -> None:
    demo = recipes.load("code_fix")
    assert [v.name for v in demo.RECIPE.variants] == ["task", "easier", "repair"]
    for variant in demo.RECIPE.variants:
        job = demo.RECIPE.variant_job(
            RECIPE, tmp_path, tmp_path / "out", 2, 3, RECIPE / variant.job
        )
        port = job.agentrft.environment.port
        assert port not in (0, 8741)
        urls = [g["url"] for g in job.rl.grader["graders"].values() if "url" in g]
        assert all(u.startswith(f"http://127.0.0.1:{port}/grade") for u in urls)
        assert job.seed == 3 and job.agentrft.train.max_steps == 2
        assert json.dumps(job.rl.grader).count("8741") == 0


def test_the_demo_reuses_rows_built_before(tmp_path, monkeypatch) -> None:
    """The first build writes the rows and its report under CACHE/KEY; a second build copies
    them and reads the same report back (counts included) without building again."""
    from collections import Counter

    from agentrft.tasks.code_fix import demo
    from agentrft.tasks.code_fix.dataset import BuildReport

    built: list[str] = []

    def build_into(data):
        built.append(str(data))
        for name in demo.DATA_DIRS:
            for split in ("train.jsonl", "val.jsonl"):
                (data.parent / name).mkdir(parents=True, exist_ok=True)
                (data.parent / name / split).write_text(json.dumps({"name": name}) + "\n")
        return BuildReport(
            train=3, val=2, dropped=Counter({"not_caught": 4}), kept_kinds=Counter(off_by_one=5)
        )

    monkeypatch.setattr(demo, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(demo, "build_into", build_into)
    first = demo.build_data(tmp_path / "a" / "data")
    second = demo.build_data(tmp_path / "b" / "data")
    assert len(built) == 1
    assert first == second
    assert second.dropped == Counter({"not_caught": 4}) and second.kept_kinds["off_by_one"] == 5
    assert (tmp_path / "b" / "data-repair" / "val.jsonl").read_text() == '{"name": "data-repair"}\n'
