"""The kernels job end to end with the model behind an OpenAI-compatible endpoint (our own
serve-model app on loopback, the real 135M model): every rollout is graded by the job's gated
`multi` in the sandbox. It proves the plumbing of `--model http://.../v1` (the path for a
stronger model than the 135M one), not the strength of any model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.endpoint import evaluate_through_endpoint
from tests.needs import needs_bwrap
from tests.unit.kernels.conftest import RECIPE

pytestmark = [pytest.mark.integration, needs_bwrap]


def test_the_kernel_task_runs_and_is_graded_against_an_endpoint(
    base_policy: Any, tmp_path: Path
) -> None:
    from agentrft.data import load_dataset
    from agentrft.tasks import runner as recipes

    job = recipes.demo_job(RECIPE, RECIPE / "data", tmp_path, 1, 1, RECIPE / "job.yaml")
    items = load_dataset(RECIPE / "data/val.jsonl")[:1]
    res, records = evaluate_through_endpoint(base_policy, job, items, 2, tmp_path / "eval")
    assert len(records) == 2
    for rec in records:
        assert not rec.get("discarded"), rec
        assert rec["grade"]["error"] is None, rec["grade"]
        assert "static" in rec["grade"]["sub_scores"]  # the first gate ran in the sandbox
        assert 0.0 <= rec["reward"] <= 1.0
    assert res["rows"] == 1
