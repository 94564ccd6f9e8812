"""The demo's own pieces (recipes/repo_research/demo.py): the job it runs, the data it builds
at its pinned commit, and the numbers it reports. The whole demo is `agentrft demo repo_research`."""

from __future__ import annotations

import pytest

from agentrft.tasks import runner as recipes

from .conftest import RECIPE


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    return recipes.load("repo_research")


@pytest.mark.parametrize("variant", ["job.yaml", "job_cliff.yaml"])
def test_demo_job_reads_the_demo_data_and_starts_the_recipes_environment(demo, tmp_path, variant):
    job = recipes.demo_job(RECIPE, tmp_path / "data", tmp_path / "out", 3, 11, RECIPE / variant)
    assert (
        job.training_file == str(tmp_path / "data" / "train.jsonl") and job.validation_file is None
    )
    assert job.seed == 11 and job.agentrft.train.max_steps == 3
    assert job.agentrft.environment is not None
    assert (
        job.resolve_path(job.agentrft.environment.dir) / "env.py"
    ).resolve() == RECIPE / "env.py"


def record(row, facts, calls, over_budget=False, tool_tokens=6):  # type: ignore[no-untyped-def]
    grade = {
        "score": -1.0 if over_budget else facts,
        "sub_scores": {} if over_budget else {"facts": facts},
        "error": None,
        "metrics": {"over_budget": over_budget},
    }
    turns = [
        {"sampled_tokens": tool_tokens, "tool_calls": [{"name": "grep"}]} for _ in range(calls)
    ] + [{"sampled_tokens": 9, "tool_calls": []}]
    return {
        "row": row,
        "reward": grade["score"],
        "grade": grade,
        "num_tool_calls": calls,
        "turns": turns,
        "discarded": None,
    }


def test_recall_counts_a_rollout_cut_off_by_the_cliff_as_recalling_nothing(demo):
    assert demo.recall_of(record(0, 1.0, 2)) == 1.0
    assert demo.recall_of(record(0, 1.0, 4, over_budget=True)) == 0.0
    assert demo.recall_of({**record(0, 1.0, 2), "discarded": "tool down"}) is None


def test_headline_and_per_question_difference(demo):
    before = [record(0, 0.0, 6), record(0, 1.0, 1), record(1, 0.5, 2), record(1, 0.5, 8)]
    after = [record(0, 1.0, 2), record(0, 1.0, 2), record(1, 0.5, 2), record(1, 1.0, 3)]
    res = {"reward": {"mean": 0.5}, "sampled_tokens": {"mean": 20.0}, "invalid_tool_calls": 0}
    a, b = demo.headline(res, before, None), demo.headline(res, after, None)
    assert a["fact recall"] == 0.5 and b["fact recall"] == pytest.approx(0.875)
    assert (
        a["tool calls max"] == 8
        and b["tool calls max"] == 3
        and a["share with > 4 calls"] == 0.5
        and b["share with > 4 calls"] == 0
    )
    assert a["tokens sent to tools"] == pytest.approx(6 * 17 / 4)
    diff = recipes.per_row(demo.RECIPE, before, after)["difference"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx((0.5 + 0.25) / 2)


def test_spread_takes_evenly_spaced_questions(demo):
    assert demo.spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert demo.spread([1, 2], 4) == [1, 2]


def test_the_demo_data_builds_at_its_pinned_commit(demo, tmp_path):
    report = demo.build_dataset(
        demo.REPO, tmp_path, rev=demo.PINNED_REV, include=demo.INCLUDE, worked_examples=0
    )
    assert report.commit == demo.PINNED_REV
    assert report.train >= demo.PREFLIGHT_ROWS and report.val >= demo.VAL_ROWS


def test_the_preflight_samples_each_question_kind_in_turn(demo):
    """The first rows of a file can all be of kinds the base model never answers; the
    pre-flight takes the kinds in turn instead, each in file order."""
    from agentrft.data.jsonl import Item

    kinds = ["raises", "where_defined", "where_defined", "docstring", "returns", "raises"]
    kinds += ["default", "returns", "imports"]
    items = [
        Item(index=i, messages=(), fields={"kind": k}, source=f"train.jsonl:{i + 1}", prefill=None)
        for i, k in enumerate(kinds)
    ]
    picked = demo.RECIPE.select_preflight(items, 6)
    assert [i.index for i in picked] == [0, 1, 3, 4, 6, 8]
    assert [i.index for i in demo.RECIPE.select_preflight(items, 8)] == [0, 1, 3, 4, 6, 8, 5, 2]
    assert len(demo.RECIPE.select_preflight(items[:2], 6)) == 2
