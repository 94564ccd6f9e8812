"""`agentrft serve` killed with SIGKILL while a job trains and clients are mid-request, then
started again on the same data directory: the job resumes from its last checkpoint and
finishes, every event seen before the kill is still there, unchanged, each step's metrics
event is there once, and no client ever got a 5xx (only refused connections while the
server was down)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.test_service import FINISHED, KEY, ServiceProcess, create_resume_test_job
from tests.unit.service.conftest import wait_status

pytestmark = pytest.mark.integration
STEPS = 2  # killed after step 1, step 2 redone after the restart


class Clients:
    """Threads that keep calling the API (events, the job, chat on the base model) through
    the kill and the restart, counting what came back."""

    def __init__(self, url: str, job_id: str, threads: int = 4) -> None:
        self.url, self.job_id = url, job_id
        self.outcomes: Counter[str] = Counter()
        self.server_errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _request(self, h: httpx.Client, i: int) -> httpx.Response:
        if i == 0:  # long enough to be in flight when the server dies
            body = {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "Count to fifty."}],
                "max_tokens": 24,
            }
            time.sleep(1.0)  # the server's cores are mostly for the training job
            return h.post("/v1/chat/completions", json=body)
        if i == 1:
            return h.get(f"/v1/fine_tuning/jobs/{self.job_id}")
        return h.get(f"/v1/fine_tuning/jobs/{self.job_id}/events", params={"limit": 100})

    def _run(self, i: int) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=120) as h:
            while not self._stop.is_set():
                try:
                    r = self._request(h, i)
                    kind = f"{r.status_code // 100}xx"
                    if r.status_code >= 500:
                        with self._lock:
                            self.server_errors.append(f"{r.status_code} {r.text[:200]}")
                except httpx.ConnectError:
                    kind = "refused"  # the server is down
                    time.sleep(0.1)
                except httpx.TransportError:
                    kind = "cut"  # in flight when the server died
                with self._lock:
                    self.outcomes[kind] += 1
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)


def all_events(client, job_id: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    events = client.fine_tuning.jobs.list_events(job_id, limit=100)
    return {e.id: {"message": e.message, "type": e.type, "data": e.data} for e in events}


def test_kill_9_under_load_resumes_with_every_event_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = ServiceProcess(data)
    clients = None
    try:
        with service.client() as client:
            job = create_resume_test_job(client, tmp_path, STEPS)
            clients = Clients(service.url, job.id)
            run = data / "jobs" / job.id
            deadline = time.monotonic() + 400
            while not (run / "checkpoints" / "latest").exists():
                assert time.monotonic() < deadline, "no checkpoint yet"
                assert service.proc.poll() is None, "the server died"
                time.sleep(0.02)
            # wait for the scheduler to turn the step's metrics into an event, then kill
            while not any(e["type"] == "metrics" for e in all_events(client, job.id).values()):
                assert time.monotonic() < deadline, "no metrics event"
                time.sleep(0.1)
            before = all_events(client, job.id)
        service.stop(signal.SIGKILL)  # the server and, with it, its worker
        killed_at = (run / "checkpoints" / "latest").read_text()
        assert killed_at != f"step-{STEPS}", "the job finished before the kill: nothing to resume"
        time.sleep(1.0)  # clients meet a closed port

        service = ServiceProcess(data, service.port)
        with service.client() as client:
            done = wait_status(client, job.id, FINISHED, timeout_s=400, poll_s=0.5)
            assert done.status == "succeeded", (
                done.error,
                (run / "worker.log").read_text()[-3000:],
            )
            after = all_events(client, job.id)
            time.sleep(1.0)  # a few requests on the finished job too
    finally:
        if clients is not None:
            clients.stop()
        service.stop()

    lost = {k: v for k, v in before.items() if after.get(k) != v}
    assert not lost, f"events seen before the kill are gone or changed: {lost}"
    steps = [e["data"]["step"] for e in after.values() if e["type"] == "metrics"]
    assert sorted(steps) == list(range(1, STEPS + 1)), steps  # each step once
    messages = [e["message"] for e in after.values()]
    assert sum("resumed from its last checkpoint" in m for m in messages) == 1, messages
    assert any(m.startswith("The server restarted") for m in messages), messages
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))  # redone steps not repeated
    assert (run / "checkpoints" / "latest").read_text() == f"step-{STEPS}"

    assert clients is not None
    assert not clients.server_errors, clients.server_errors
    assert clients.outcomes["refused"] > 0, clients.outcomes  # the clients saw the outage
    assert clients.outcomes["2xx"] > 0, clients.outcomes
    assert set(clients.outcomes) <= {"2xx", "refused", "cut"}, clients.outcomes
