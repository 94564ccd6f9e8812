"""Tool and grader secrets of a service job are never in the clear on disk nor in a reply:
a job with secrets in headers, URL userinfo and query values, created through the openai
SDK and run by the fake worker, leaves none of them in the data directory (database, WAL,
run directory, every file), in any API response or on the dashboard; the worker still gets
them, in memory. A missing or wrong secret key stops the server with the fix."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from agentrft.errors import ConfigError
from agentrft.redact import mask_secret
from agentrft.service.secret_store import KEY_ENV, SecretStore
from tests.unit.service.conftest import (
    GRADER,
    KEY_A,
    TOOL,
    fake_worker_server,
    raw,
    sdk_client,
    upload,
    wait_status,
)

TOOL_AUTH = "Bearer sk-tool-f00dcafe1"
URL_PASS = "urlpass-b16b00b5"
TOOL_QUERY = "query-key-deadbeef"
GRADER_AUTH = "Bearer sk-grader-c0ffee42"
GRADER_QUERY = "grader-q-8badf00d"
SECRETS = [TOOL_AUTH.split()[1], URL_PASS, TOOL_QUERY, GRADER_AUTH.split()[1], GRADER_QUERY]
TOOL_URL = f"http://user:{URL_PASS}@127.0.0.1:9/tools/lookup_country?api_key={TOOL_QUERY}"


def secret_method() -> dict:
    return {
        "type": "reinforcement",
        "reinforcement": {
            "grader": {
                "type": "multi",
                "graders": {
                    "answer": GRADER,
                    "env": {
                        "type": "endpoint",
                        "name": "env",
                        "url": f"http://127.0.0.1:9/grade?token={GRADER_QUERY}",
                        "headers": {"Authorization": GRADER_AUTH},
                    },
                },
                "calculate_output": "answer + env",
            },
            "tools": [{**TOOL, "server_url": TOOL_URL, "headers": {"Authorization": TOOL_AUTH}}],
            "max_episode_steps": 2,
        },
    }


def leaks(text: str | bytes) -> list[str]:
    data = text if isinstance(text, bytes) else text.encode()
    return [s for s in SECRETS if s.encode() in data]


def assert_data_dir_clean(data_dir: Path) -> None:
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    for path in files:
        assert not leaks(path.read_bytes()), f"{path} holds {leaks(path.read_bytes())}"


def test_job_secrets_stay_out_of_disk_replies_and_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    server = fake_worker_server(data_dir, monkeypatch, api_keys=frozenset({KEY_A}))
    replies: list[str] = []
    try:
        with sdk_client(server, KEY_A) as client:
            f = upload(client)
            created = client.fine_tuning.jobs.with_raw_response.create(
                model="smollm2-135m-instruct",
                training_file=f.id,
                method=secret_method(),  # type: ignore[arg-type]
                metadata={"fake_steps": "1"},
            )
            replies.append(created.text)
            job_id = created.parse().id
            wait_status(client, job_id, {"succeeded", "failed"})
            assert (data_dir / "service.db-wal").is_file()  # the server is up: the WAL is there
            assert_data_dir_clean(data_dir)
            job = json.loads(raw(server, "GET", f"/v1/fine_tuning/jobs/{job_id}").text)
            assert job["status"] == "succeeded", job["error"]
            for path in (
                f"/v1/fine_tuning/jobs/{job_id}",
                "/v1/fine_tuning/jobs",
                f"/v1/fine_tuning/jobs/{job_id}/events?limit=100",
                f"/v1/fine_tuning/jobs/{job_id}/checkpoints",
                "/",
                f"/dashboard/jobs/{job_id}",
            ):
                reply = raw(server, "GET", path)
                assert reply.status_code == 200, (path, reply.text)
                replies.append(reply.text)
    finally:
        server.stop()
    assert_data_dir_clean(data_dir)
    for reply in replies:
        assert not leaks(reply), f"a reply holds {leaks(reply)}: {reply[:300]}"
    # shown masked the way OpenAI shows keys, the rest of the job as sent
    tool = job["method"]["reinforcement"]["tools"][0]
    assert tool["headers"]["Authorization"] == mask_secret(TOOL_AUTH) == "Bear...afe1"
    assert (
        tool["server_url"]
        == "http://user...00b5@127.0.0.1:9/tools/lookup_country?api_key=quer...beef"
    )
    grader = job["method"]["reinforcement"]["grader"]["graders"]["env"]
    assert grader["headers"]["Authorization"] == mask_secret(GRADER_AUTH)
    assert grader["url"] == "http://127.0.0.1:9/grade?token=grad...f00d"
    # the worker got every secret, in memory (it wrote their hashes only)
    seen = json.loads((data_dir / "jobs" / job_id / "fake_worker_secrets.json").read_text())
    assert seen == sorted(hashlib.sha256(v.encode()).hexdigest() for v in (TOOL_AUTH, TOOL_URL))
    key_file = data_dir / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not (data_dir / "secrets" / f"{job_id}.fernet").exists()  # deleted when it ended


def test_a_missing_or_wrong_secret_key_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    store = SecretStore.open(tmp_path)
    store.put("ftjob-1", {"headers": {"Authorization": TOOL_AUTH}})
    assert store.get("ftjob-1") == {"headers": {"Authorization": TOOL_AUTH}}
    assert not leaks((tmp_path / "secrets" / "ftjob-1.fernet").read_bytes())
    assert stat.S_IMODE((tmp_path / "secrets" / "ftjob-1.fernet").stat().st_mode) == 0o600

    from cryptography.fernet import Fernet

    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    with pytest.raises(ConfigError, match="cannot be decrypted with the secret key from"):
        SecretStore.open(tmp_path)
    monkeypatch.setenv(KEY_ENV, "not-a-key")
    with pytest.raises(ConfigError, match="not a Fernet key"):
        SecretStore.open(tmp_path)
    monkeypatch.delenv(KEY_ENV)
    (tmp_path / "secret.key").unlink()
    with pytest.raises(ConfigError, match="the secret key is missing"):
        SecretStore.open(tmp_path)


def test_a_job_s_secrets_are_deleted_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Succeeded, failed or cancelled: the encrypted copy goes with the job. Paused: it stays,
    for the resume. A job that ended while the server was being killed: gone at the next
    start."""
    data_dir = tmp_path / "data"
    secrets = data_dir / "secrets"
    server = fake_worker_server(data_dir, monkeypatch, api_keys=frozenset({KEY_A}), workers=4)

    def create(client, **metadata: str) -> str:  # type: ignore[no-untyped-def]
        job = client.fine_tuning.jobs.create(
            model="smollm2-135m-instruct",
            training_file=upload(client).id,
            method=secret_method(),  # type: ignore[arg-type]
            metadata=metadata,
        )
        assert (secrets / f"{job.id}.fernet").is_file()
        return str(job.id)

    try:
        with sdk_client(server, KEY_A) as client:
            done = create(client, fake_steps="1")
            failed = create(client, fake_fail="the run diverged")
            cancelled = create(client, fake_steps="50", fake_step_s="0.2")
            paused = create(client, fake_steps="50", fake_step_s="0.2")
            wait_status(client, done, {"succeeded"})
            wait_status(client, failed, {"failed"})
            for job_id in (cancelled, paused):
                wait_status(client, job_id, {"running"})
            client.fine_tuning.jobs.cancel(cancelled)
            client.fine_tuning.jobs.pause(paused)
            wait_status(client, paused, {"paused"})
            assert sorted(p.stem for p in secrets.glob("*.fernet")) == [paused]
            store = SecretStore.open(data_dir)
    finally:
        server.stop()
    # as if the server had been killed between the end of `done` and the deletion
    store.put(done, {"headers": {"Authorization": TOOL_AUTH}})
    server = fake_worker_server(data_dir, monkeypatch, api_keys=frozenset({KEY_A}))
    try:
        assert sorted(p.stem for p in secrets.glob("*.fernet")) == [paused]
    finally:
        server.stop()
    assert_data_dir_clean(data_dir)
