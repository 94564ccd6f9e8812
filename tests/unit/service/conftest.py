"""A real service on loopback (uvicorn in a thread) with the fake worker, and SDK clients
for two API keys."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[3]
KEY_A, KEY_B = "sk-test-alice", "sk-test-bob"
ROWS = [
    {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "answer": "Paris",
    },
    {"messages": [{"role": "user", "content": "What is the currency of Japan?"}], "answer": "yen"},
]
GRADER = {
    "type": "string_check",
    "name": "answer",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "ilike",
}
TOOL = {
    "type": "function",
    "name": "lookup_country",
    "description": "Look up a country.",
    "parameters": {
        "type": "object",
        "properties": {"country": {"type": "string"}},
        "required": ["country"],
    },
    "server_url": "http://127.0.0.1:9/tools/lookup_country",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """uvicorn serving `create_app` in a background thread; `stop()` waits for it."""

    def __init__(self, data_dir: Path, **kwargs: object) -> None:
        import uvicorn

        from agentrft.service.app import create_app

        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(data_dir, **kwargs)  # type: ignore[arg-type]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def fake_worker_server(data_dir: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> Server:
    """A Server whose jobs run on the fake worker (no model), polled every 50 ms."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return Server(data_dir, worker_module="tests.unit.service.fake_worker", poll_s=0.05, **kwargs)


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    server = fake_worker_server(
        tmp_path / "data", monkeypatch, api_keys=frozenset({KEY_A, KEY_B}), workers=2
    )
    yield server
    server.stop()


def sdk_client(server: Server, key: str, timeout: float = 30):
    """The openai SDK's client of `server`, calling with `key`, never retrying."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=timeout)


@pytest.fixture
def alice(service: Server):
    with sdk_client(service, KEY_A) as client:
        yield client


@pytest.fixture
def bob(service: Server):
    with sdk_client(service, KEY_B) as client:
        yield client


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def upload(
    client, rows: list[dict] | None = None, name: str = "train.jsonl", purpose: str = "fine-tune"
):
    return client.files.create(file=(name, jsonl(rows or ROWS)), purpose=purpose)


def create_job(client, training_file: str, *, metadata: dict | None = None, **extra):
    method = {
        "type": "reinforcement",
        "reinforcement": {"grader": GRADER, "tools": [TOOL], "max_episode_steps": 2},
    }
    return client.fine_tuning.jobs.create(
        model="smollm2-135m-instruct",
        training_file=training_file,
        method=method,
        metadata=metadata,
        **extra,
    )


def wait_status(
    client, job_id: str, statuses: set[str], timeout_s: float = 20, poll_s: float = 0.05
):
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} stayed {job.status}"
        time.sleep(poll_s)


def raw(
    service: Server,
    method: str,
    path: str,
    key: str | None = KEY_A,
    headers: dict | None = None,
    **kwargs,
) -> httpx.Response:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.request(method, service.url + path, headers=headers, timeout=30, **kwargs)
