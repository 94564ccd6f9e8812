"""`agentrft serve --executor ray`: the same API with jobs as Ray tasks, on a local Ray the
server starts (and stops) itself. The jobs run on the unit tests' fake worker (no model)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.unit.service.conftest import (
    KEY_A,
    create_job,
    fake_worker_server,
    sdk_client,
    upload,
    wait_status,
)

pytest.importorskip("ray")
pytestmark = pytest.mark.integration


def test_jobs_run_as_ray_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = fake_worker_server(
        tmp_path / "data", monkeypatch, api_keys=frozenset({KEY_A}), executor="ray", workers=2
    )
    try:
        with sdk_client(server, KEY_A, timeout=60) as client:
            f = upload(client)
            job = create_job(client, f.id, metadata={"fake_steps": "3"})
            done = wait_status(client, job.id, {"succeeded", "failed"}, timeout_s=120)
            assert done.status == "succeeded", done.error
            assert [
                e.data["step"]
                for e in reversed(list(client.fine_tuning.jobs.list_events(job.id, limit=100)))
                if e.type == "metrics"
            ] == [1, 2, 3]
            assert [
                c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data
            ] == [3, 2, 1]

            long = create_job(client, f.id, metadata={"fake_steps": "500", "fake_step_s": "0.1"})
            wait_status(client, long.id, {"running"}, timeout_s=60)
            while not client.fine_tuning.jobs.checkpoints.list(long.id).data:
                time.sleep(0.05)
            t0 = time.monotonic()
            assert client.fine_tuning.jobs.cancel(long.id).status == "cancelled"
            assert time.monotonic() - t0 < 20
            n = len(client.fine_tuning.jobs.checkpoints.list(long.id, limit=100).data)
            time.sleep(1.0)
            assert (
                len(client.fine_tuning.jobs.checkpoints.list(long.id, limit=100).data) == n
            )  # the task's worker is gone
    finally:
        server.stop()
