"""The demo's own pieces (recipes/kernels/demo.py): its jobs load and point at its data, and
the numbers it reports (how far rollouts got through the gates, best-of-k) count right. The
whole demo is `agentrft demo kernels`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrft.data import load_dataset
from agentrft.job import load_job
from agentrft.tasks import runner as recipes

from .conftest import RECIPE


@pytest.fixture(scope="module")
def demo() -> Any:
    return recipes.load("kernels")


def record(row: int, reward: float, **subs: float) -> dict[str, Any]:
    return {"row": row, "reward": reward, "grade": {"sub_scores": subs}}


def test_gate_counts_say_where_rollouts_stopped(demo: Any) -> None:
    records = [
        record(0, 0.0, static=0.0),
        record(0, 0.0, static=1.0, **{"checked.correct": 0.5}),
        record(1, 0.6, static=1.0, **{"checked.correct": 1.0}),
        record(1, 0.0, static=0.0),
        {"row": 2, "reward": None, "discarded": True},
    ]
    counts = demo.gate_counts(records)
    assert counts["rollouts graded"] == 4
    assert counts["stopped by static gate"] == 0.5
    assert counts["stopped by correctness gate"] == 0.25
    assert counts["correct (scored for speed)"] == 0.25


def test_best_of_k_is_the_best_of_each_rows_first_k(demo: Any) -> None:
    records = [record(0, 0.0), record(0, 0.6), record(0, 0.9), record(1, 0.2), record(1, 0.0)]
    res = demo.best_of(records, 2)
    assert res["single sample"] == pytest.approx((0.0 + 0.2) / 2)
    assert res["best-of-2"] == pytest.approx((0.6 + 0.2) / 2)


@pytest.mark.parametrize("name", ["job.yaml", "job_easy.yaml"])
def test_the_demos_jobs_read_its_data(demo: Any, tmp_path: Path, name: str) -> None:
    job = recipes.demo_job(RECIPE, tmp_path / "data", tmp_path, 3, 5, RECIPE / name)
    assert job.training_path == tmp_path / "data/train.jsonl"
    assert job.seed == 5 and job.agentrft.train.max_steps == 3
    assert load_job(RECIPE / name).rl.grader["type"] == "multi"


def test_the_main_job_has_no_prefill_so_an_endpoint_can_run_it() -> None:
    assert load_job(RECIPE / "job.yaml").agentrft.prefill is None
    assert all(row.prefill is None for row in load_dataset(RECIPE / "data/train.jsonl"))
    # the easier variant's prefill is in its rows: each reply starts as the kernel's signature
    easy = load_dataset(RECIPE / "data-easy/train.jsonl")
    assert easy and all(row.prefill and row.prefill.endswith("    return ") for row in easy)
