"""Secrets never reach a run directory: header values, URL credentials (user:password@ and
query values such as ?api_key=) and the environment server's variables are redacted in
job.json and in discard reasons (rollouts.jsonl, metric keys); run directories are 0700 and
their files 0600; a resume takes the secrets from the job file again."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrft.cli import main
from agentrft.errors import ConfigError, ToolUnavailable
from agentrft.redact import REDACTED, redact_job, redact_url, redact_urls
from agentrft.rollout.records import summarize
from agentrft.tools.envkit import ToolServer, serve_in_thread
from agentrft.tools.http import HttpTool
from agentrft.train.observe import RunLog
from agentrft.types import StopReason, ToolCall

SECRETS = [
    "tool-secret-1",
    "url-pass-2",
    "query-secret-3",
    "grader-secret-4",
    "grader-query-5",
    "judge-secret-6",
    "env-secret-7",
]


def secret_job(tmp: Path, url: str = "http://127.0.0.1:9") -> dict[str, Any]:
    host = url.split("://", 1)[1]
    return {
        "training_file": "train.jsonl",
        "seed": 1,
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "endpoint",
                    "name": "env",
                    "url": f"http://{host}/grade?token=grader-query-5",
                    "headers": {"X-Api-Key": "grader-secret-4"},
                },
                "tools": [
                    {
                        "name": "lookup",
                        "description": "look a word up",
                        "parameters": {"type": "object", "properties": {}},
                        "server_url": f"http://user:url-pass-2@{host}/tools/lookup?api_key=query-secret-3",
                        "headers": {"Authorization": "Bearer tool-secret-1"},
                    }
                ],
            },
        },
        "agentrft": {
            "judge": {"headers": {"Authorization": "judge-secret-6"}},
            "environment": {"app": "nowhere:app", "env": {"DB_PASSWORD": "env-secret-7"}},
        },
    }


def assert_clean(run_dir: Path) -> None:
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in [run_dir, *run_dir.rglob("*")]:
        assert not any(s in str(path) for s in SECRETS), path
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is readable by others"
        if path.is_file():
            data = path.read_bytes()
            leaked = [s for s in SECRETS if s.encode() in data]
            assert not leaked, f"{path} holds {leaked}"


def test_redaction_of_urls_and_jobs() -> None:
    assert (
        redact_url("https://bob:pw@h.example/x?api_key=k1&q=2")
        == f"https://{REDACTED}@h.example/x?api_key={REDACTED}&q={REDACTED}"
    )
    assert redact_urls("http://h/a?key=s1: HTTP 500") == f"http://h/a?key={REDACTED}: HTTP 500"
    job = redact_job(secret_job(Path(".")))
    text = json.dumps(job)
    assert not any(s in text for s in SECRETS)
    assert job["method"]["reinforcement"]["tools"][0]["headers"] == {"Authorization": REDACTED}


def test_a_failed_run_leaves_no_secret_on_disk_and_resume_restores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(secret_job(tmp_path)))
    (tmp_path / "train.jsonl").write_text("not json\n")  # the run fails after writing its folder
    run_dir = tmp_path / "runs" / "r1"
    assert main(["train", str(job_path), "--out", str(run_dir)]) == 2
    assert "train.jsonl" in capsys.readouterr().err
    assert (run_dir / "job.json").is_file()
    assert_clean(run_dir)

    from agentrft.train.loop import _resumed_job

    job = _resumed_job(run_dir, None)  # the job file still matches: its secrets come back
    assert job.rl.tools[0].headers == {"Authorization": "Bearer tool-secret-1"}
    changed = secret_job(tmp_path)
    changed["seed"] = 2
    job_path.write_text(json.dumps(changed))
    with pytest.raises(ConfigError, match="--resume"):
        _resumed_job(run_dir, None)


def test_url_credentials_stay_out_of_discard_reasons_and_metric_keys(tmp_path: Path) -> None:
    env = ToolServer("failing")

    @env.tool
    def lookup(ctx: Any) -> str:
        raise RuntimeError("down")

    class Spec:
        name = "lookup"
        headers = {"Authorization": "Bearer tool-secret-1"}
        timeout_s = None

    with serve_in_thread(env.app) as url:
        Spec.server_url = (
            url.replace("http://", "http://user:url-pass-2@")
            + "/tools/lookup?api_key=query-secret-3"
        )  # type: ignore[attr-defined]
        tool = HttpTool(Spec(), timeout_s=2, retries=1, backoff_s=0)

        async def call() -> None:
            async with httpx.AsyncClient() as client:
                await tool(ToolCall("fc_1", "call_1", "lookup", "{}"), "trace_s", {}, client)

        with pytest.raises(ToolUnavailable) as info:
            asyncio.run(call())
    reason = str(info.value)
    assert "HTTP 500" in reason
    assert not any(s in reason for s in SECRETS), reason

    class Traj:  # the fields summarize reads from a discarded rollout
        discarded = reason
        stop_reason = StopReason.TOOL_ERROR

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    log = RunLog(run_dir)
    log.log(1, {"rollouts": summarize([Traj()])})  # type: ignore[list-item]
    log.close()
    text = (run_dir / "metrics.jsonl").read_text()
    assert "discard_reasons" in text
    assert not any(s in text for s in SECRETS)


def test_cli_run_directories_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        from agentrft.rollout.records import new_output_dir

        d = new_output_dir(tmp_path / "x", "eval")
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    finally:
        os.umask(old)
