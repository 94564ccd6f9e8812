"""The demo's own pieces (recipes/file_selection/demo.py): the job it runs, the numbers it
reports, and the rollout it shows. The whole demo is `make demo`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrft.console import console
from agentrft.tasks import runner as recipes

RECIPE = Path(__file__).resolve().parents[3] / "agentrft" / "tasks" / "file_selection"


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    return recipes.load("file_selection")


def test_demo_job_reads_the_demo_data_and_writes_under_its_folder(demo, tmp_path):
    job = recipes.demo_job(
        RECIPE, tmp_path / "data", tmp_path / "out", steps=3, seed=11, job_path=None
    )
    assert (
        job.training_file == str(tmp_path / "data" / "train.jsonl") and job.validation_file is None
    )
    assert job.seed == 11 and job.agentrft.output_dir == str(tmp_path / "out")
    assert job.agentrft.train.max_steps == 3 and job.agentrft.train.checkpoint_interval == 3
    assert job.agentrft.environment is not None
    assert (
        job.resolve_path(job.agentrft.environment.dir) / "env.py"
    ).resolve() == RECIPE / "env.py"  # the environment still starts from the recipe


def record(reward, calls, request):  # type: ignore[no-untyped-def]
    messages = [
        {"role": "system", "content": "SYSTEM PROMPT"},
        {"role": "user", "content": "worked example"},
        {"role": "user", "content": request},
    ]
    if calls:
        messages += [
            {"role": "assistant", "content": "<tool_call>...</tool_call>"},
            {"role": "tool", "name": "grep", "content": "src/a.py"},
        ]
    messages.append({"role": "assistant", "content": '["src/a.py"]'})
    return {
        "reward": reward,
        "num_tool_calls": calls,
        "messages": messages,
        "item": {"files": ["src/a.py"]},
    }


def test_the_best_rollout_with_a_tool_call_is_shown_from_its_request_on(demo):
    records = [
        record(0.9, 0, "no tools used"),
        record(0.4, 1, "the winner"),
        record(0.2, 2, "a loser"),
    ]
    with console.capture() as cap:
        recipes.show_best_rollout(demo.RECIPE, records, "trained")
    out = cap.get()
    assert "the winner" in out and "reward=0.400" in out and "expected: src/a.py" in out
    assert "SYSTEM PROMPT" not in out and "worked example" not in out and "a loser" not in out
    with console.capture() as cap:
        recipes.show_best_rollout(demo.RECIPE, [record(0.9, 0, "x")], "trained")
    assert "no rollout called a tool" in cap.get()


def test_headline_names_the_reward_formula_and_every_sub_grader(demo):
    res = {
        "reward": {"mean": 0.25},
        "sub_rewards": {"files": 0.1, "files.precision": 0.2, "found": 0.5},
        "tool_calls": {"p50": 1.0, "p95": 2.0},
        "turns": {"mean": 2.0},
        "sampled_tokens": {"mean": 30.0},
        "invalid_tool_calls": 3,
    }
    job = SimpleNamespace(
        rl=SimpleNamespace(
            grader={"type": "multi", "calculate_output": "0.6 * files + 0.4 * found"}
        )
    )
    row = demo.headline(res, [], job)
    assert row["reward (0.6 * files + 0.4 * found)"] == 0.25
    assert row["mean file F1"] == 0.1 and row["sub-grader found"] == 0.5
    assert "sub-grader files.precision" not in row and row["invalid tool calls"] == 3.0
    assert row["tool calls per turn"] == 0.0  # no rollouts given


def test_the_demo_can_run_a_variant_of_the_job(demo, tmp_path):
    job = recipes.demo_job(
        RECIPE, tmp_path / "data", tmp_path / "out", None, None, RECIPE / "history" / "job_v5.yaml"
    )
    assert (
        job.rl.grader["calculate_output"] == "0.7 * files + 0.3 * near"
    )  # v5's reward, not job.yaml's
    assert job.training_file == str(tmp_path / "data" / "train.jsonl")
    assert job.agentrft.environment is not None
    assert (
        job.resolve_path(job.agentrft.environment.dir) / "env.py"
    ).resolve() == RECIPE / "env.py"
