"""The engine check on the local engine and the real 135M model (fp32, where a synced
sampler gives the trainer's log-probs to rounding): with every sync the gap stays near 0;
skip one sync and the next step stops with EngineMismatch."""

from __future__ import annotations

import json

import pytest

from agentrft.engine import LocalEngine
from agentrft.errors import EngineMismatch
from agentrft.job import load_job
from agentrft.train.loop import train
from tests.integration.test_train import make_job

pytestmark = pytest.mark.integration

TIGHT = {"warn_gap": 0.0005, "stop_gap": 0.002}


def with_check(path, check):
    job = json.loads(path.read_text())
    job["agentrft"]["engine"] = "local"
    job["agentrft"]["engine_check"] = check
    path.write_text(json.dumps(job))
    return load_job(path)


def test_the_gap_is_near_zero_when_every_step_syncs(tmp_path):
    run = tmp_path / "run"
    train(with_check(make_job(tmp_path, 2), TIGHT), run)
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]
    assert [m["engine"] for m in steps] == ["local", "local"]
    assert [m["sampled_with"] for m in steps] == ["base", "step-1"]
    gaps = [m["engine/logprob_gap"] for m in steps if "engine/logprob_gap" in m]
    assert gaps and max(gaps) < 1e-3, gaps


def test_a_skipped_sync_stops_the_next_step(tmp_path, monkeypatch):
    real = LocalEngine.sync

    def skip_first(self, model, step):  # the sync "happens" but the sampler keeps old weights
        if step == 1:
            self.adapter = "step-1"
            return {}
        return real(self, model, step)

    monkeypatch.setattr(LocalEngine, "sync", skip_first)
    with pytest.raises(EngineMismatch, match="step 2: the local engine.*stop_gap") as err:
        train(with_check(make_job(tmp_path, 2), TIGHT), tmp_path / "run")
    assert "adapter sync" in str(err.value)
