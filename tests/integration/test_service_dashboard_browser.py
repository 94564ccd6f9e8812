"""The service dashboard in headless Chromium while a job runs: the screenshot shows the
reward curve and the tool-calls histogram drawn, not just a page that loads. The job runs
on the unit tests' fake worker (no model)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.test_report_browser import chromium
from tests.unit.service.conftest import (
    KEY_A,
    create_job,
    fake_worker_server,
    sdk_client,
    upload,
    wait_status,
)

pytestmark = pytest.mark.browser


def test_dashboard_renders_a_running_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = fake_worker_server(tmp_path / "data", monkeypatch, api_keys=frozenset({KEY_A}))
    try:
        with sdk_client(server, KEY_A) as client:
            job = create_job(
                client, upload(client).id, metadata={"fake_steps": "200", "fake_step_s": "0.1"}
            )
            wait_status(client, job.id, {"running"})
            while (
                len(
                    [
                        e
                        for e in client.fine_tuning.jobs.list_events(job.id, limit=100)
                        if e.type == "metrics"
                    ]
                )
                < 4
            ):
                time.sleep(0.1)
            url = f"{server.url}/dashboard/jobs/{job.id}?key={KEY_A}"
            dom = chromium(tmp_path, "--dump-dom", url)
            assert dom.returncode == 0, dom.stderr[-2000:]
            for sid in ("reward-curve", "tool-calls", "stop-reasons", "trajectories"):
                assert f'<section id="{sid}">' in dom.stdout, sid
            assert dom.stdout.count('src="data:image/png;base64,') == 2
            shot = tmp_path / "shot.png"
            run = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2000", url)
            assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
            assert (
                client.fine_tuning.jobs.retrieve(job.id).status == "running"
            )  # it was live throughout
            client.fine_tuning.jobs.cancel(job.id)
    finally:
        server.stop()
    colors = Counter(Image.open(shot).convert("RGB").getdata())
    near = lambda rgb, target: sum(abs(a - b) for a, b in zip(rgb, target, strict=True)) < 40  # noqa: E731
    assert (
        sum(n for rgb, n in colors.items() if near(rgb, (31, 119, 180))) > 200
    )  # the reward curve (matplotlib's first colour)
    assert (
        sum(n for rgb, n in colors.items() if near(rgb, (22, 163, 74))) > 500
    )  # the histogram's "after" bars (#16a34a)
    assert (
        sum(n for rgb, n in colors.items() if near(rgb, (107, 114, 128))) > 500
    )  # and its "before" bars (#6b7280)
