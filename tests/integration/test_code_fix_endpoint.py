"""The code-fix job end to end with the model behind an OpenAI-compatible endpoint (our own
serve-model app on loopback, the real 135M model): rollouts reach the recipe's environment,
and every rollout is graded by the job's gated `multi` through the environment's endpoints.
It proves the plumbing of `--model http://.../v1`, not the strength of any model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.endpoint import evaluate_through_endpoint
from tests.needs import needs_bwrap
from tests.unit.code_fix.conftest import RECIPE, make_project

pytestmark = [pytest.mark.integration, needs_bwrap]


def test_the_task_runs_and_is_graded_against_an_endpoint(base_policy: Any, tmp_path: Path) -> None:
    from agentrft.data import load_dataset
    from agentrft.tasks import runner as recipes
    from agentrft.tasks.code_fix.dataset import build_dataset

    project = tmp_path / "calc"
    project.mkdir()
    make_project(project)
    report = build_dataset(project, tmp_path / "data", include=["calc/core.py"], max_per_file=2)
    assert report.kept >= 1
    demo = recipes.load("code_fix")
    job = demo.variant_job(demo.HERE, tmp_path / "data", tmp_path / "out", 1, 1, None)
    items = load_dataset(tmp_path / "data/train.jsonl")[:1]
    res, records = evaluate_through_endpoint(base_policy, job, items, 2, tmp_path / "eval")
    assert len(records) == 2
    for rec in records:
        assert not rec.get("discarded"), rec
        grade = rec["grade"]
        assert grade["error"] is None, grade
        assert "tests" in grade["sub_scores"]  # the gate ran through the environment
        assert 0.0 <= rec["reward"] <= 1.0
    assert res["rows"] == 1 and RECIPE.is_dir()
