"""Async steps on the real 135M model (local engine): the pipeline at max_staleness 0 gives
the synchronous loop's numbers and weights exactly; at 1, step t+1 rolls out on version t
while step t updates, its rollouts are counted off-policy and importance-weighted, and a
seeded run reproduces itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrft.job import load_job
from agentrft.train.loop import train
from tests.integration.test_train import make_job

pytestmark = pytest.mark.integration

TIMING = ("time/", "memory/", "async/", "sampler/busy_s", "engine/busy_share", "rollouts/latency")


def steps_of(run: Path) -> list[dict]:
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln]
    return [m for m in lines if m["step"] > 0]


def numbers(run: Path) -> list[dict]:
    """The metrics that do not depend on the clock."""
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in steps_of(run)]


def final_adapter(run: Path, steps: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / f"checkpoints/step-{steps}/adapter/adapter_model.safetensors"))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_pipeline_at_staleness_zero_is_the_synchronous_loop(tmp_path):
    job = load_job(make_job(tmp_path, 3))
    train(job, tmp_path / "sync")
    train(job, tmp_path / "pipeline", async_steps=True)
    assert numbers(tmp_path / "sync") == numbers(tmp_path / "pipeline")
    assert same_weights(
        final_adapter(tmp_path / "sync", 3), final_adapter(tmp_path / "pipeline", 3)
    )
    piped = steps_of(tmp_path / "pipeline")
    assert [m["async/staleness"] for m in piped] == [0.0, 0.0, 0.0]
    assert all(0 <= m["time/trainer_idle_share"] <= 1 for m in piped)


def test_staleness_one_rolls_out_ahead_and_reproduces_itself(tmp_path):
    job = load_job(make_job(tmp_path, 3, max_staleness=1))
    train(job, tmp_path / "a")
    steps = steps_of(tmp_path / "a")
    assert [m["sampled_with"] for m in steps] == ["base", "base", "step-1"]
    assert [m["async/staleness"] for m in steps] == [0.0, 1.0, 1.0]
    assert [m["async/off_policy_rollouts"] for m in steps] == [0.0, 8.0, 8.0]
    assert all(m["async/dropped_stale"] == 0 for m in steps)
    # step 2 trained on base-model rollouts after step 1's update: importance weights differ
    # from 1 (tis_cap defaults on for async steps), and its log-prob gap is the update's drift
    assert steps[0]["train/tis_weight"] == pytest.approx(1.0, abs=1e-4)
    assert steps[1]["train/tis_weight"] != pytest.approx(1.0, abs=1e-4)
    assert steps[1]["engine/logprob_gap"] > 100 * steps[0]["engine/logprob_gap"]
    # step 3's rollouts were still running when the update of step 2 made version 2
    assert steps[2]["async/finished_on_old_version"] >= 0
    train(job, tmp_path / "b")  # the schedule does not depend on timing: same weights
    assert numbers(tmp_path / "a") == numbers(tmp_path / "b")
    assert same_weights(final_adapter(tmp_path / "a", 3), final_adapter(tmp_path / "b", 3))
    sync = tmp_path / "sync"
    train(load_job(make_job(tmp_path, 3)), sync)
    assert not same_weights(final_adapter(sync, 3), final_adapter(tmp_path / "a", 3))
