"""`agentrft serve` end to end with the official openai SDK and the real 135M model: the
quickstart job through files, fine_tuning.jobs, events, checkpoints, chat completions on
the fine-tuned model and the graders API; and a server killed with SIGKILL mid-job that,
restarted, finishes the job with the same weights as an uninterrupted run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from tests.integration.test_train import adapter, make_job
from tests.unit.service.conftest import wait_status

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
KEY = "sk-integration"
FINISHED = {"succeeded", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceProcess:
    """`agentrft serve` as a user starts it, in its own process."""

    def __init__(self, data_dir: Path, port: int | None = None, *extra_args: str) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "AGENTRFT_API_KEYS": KEY, "PYTHONUNBUFFERED": "1"}
        self.log = (data_dir.parent / f"serve-{self.port}-{time.monotonic_ns()}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrft.cli",
                "serve",
                "--data-dir",
                str(data_dir),
                "--port",
                str(self.port),
                *extra_args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, "agentrft serve exited"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "agentrft serve did not start"
            time.sleep(0.1)

    def client(self):  # type: ignore[no-untyped-def]
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, timeout=300)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def create_resume_test_job(client, tmp_path: Path, steps: int):  # type: ignore[no-untyped-def]
    """agentrft train's resume test job (test_train.py), `steps` steps, sent through the API."""
    job_file = json.loads(make_job(tmp_path, steps).read_text())
    f = client.files.create(file=(tmp_path / "train.jsonl").open("rb"), purpose="fine-tune")
    return client.fine_tuning.jobs.create(
        model=job_file["model"],
        training_file=f.id,
        seed=job_file["seed"],
        method=job_file["method"],
        extra_body={"agentrft": job_file["agentrft"]},
    )


@pytest.fixture
def tool_server() -> Iterator[str]:
    """The quickstart's tool server (examples/quickstart/env.py) on loopback."""
    import uvicorn

    spec = importlib.util.spec_from_file_location("quickstart_env", QUICKSTART / "env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(module.app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_quickstart_through_the_openai_sdk(tmp_path: Path, tool_server: str, executor: str) -> None:
    if executor == "ray":
        pytest.importorskip("ray")
    spec = yaml.safe_load((QUICKSTART / "job.yaml").read_text())
    rl = spec["method"]["reinforcement"]
    tools = [{**t, "server_url": tool_server + t["server_url"]} for t in rl["tools"]]
    # the quickstart's settings, less its environment (the tool server runs above) and its
    # second worked example (the prompt's length sets the update's time)
    ext = {k: v for k, v in spec["agentrft"].items() if k != "environment"}
    ext["few_shot_messages"] = ext["few_shot_messages"][:4]
    ext.update(
        sampling={**ext["sampling"], "max_tokens_per_turn": 40, "max_tokens_per_episode": 96}
    )
    ext.update(group_size=2, train={"max_steps": 1, "checkpoint_interval": 1})
    val_rows = (QUICKSTART / "val.jsonl").read_text().splitlines()[:1]
    (tmp_path / "val.jsonl").write_text("\n".join(val_rows) + "\n")

    service = ServiceProcess(tmp_path / "data", None, "--executor", executor)
    try:
        with service.client() as client:
            train_file = client.files.create(
                file=(QUICKSTART / "train.jsonl").open("rb"), purpose="fine-tune"
            )
            val_file = client.files.create(
                file=(tmp_path / "val.jsonl").open("rb"), purpose="fine-tune"
            )
            job = client.fine_tuning.jobs.create(
                model=spec["model"],
                training_file=train_file.id,
                validation_file=val_file.id,
                seed=spec["seed"],
                suffix="quickstart",
                method={
                    "type": "reinforcement",
                    "reinforcement": {
                        "grader": rl["grader"],
                        "tools": tools,
                        "max_episode_steps": 2,
                        "hyperparameters": {"batch_size": 2, "n_epochs": 1, "eval_samples": 1},
                    },
                },
                extra_body={"agentrft": ext},
            )
            done = wait_status(client, job.id, FINISHED, timeout_s=300, poll_s=0.5)
            assert done.status == "succeeded", (
                done.error,
                (tmp_path / "data/jobs" / job.id / "worker.log").read_text()[-3000:],
            )
            assert done.fine_tuned_model and done.fine_tuned_model.startswith(
                "ft:smollm2-135m-instruct:agentrft:quickstart:"
            )

            events = list(client.fine_tuning.jobs.list_events(job.id, limit=50))
            metrics = [e for e in events if e.type == "metrics"]
            assert {e.data["step"] for e in metrics} == {0, 1}  # the baseline eval, then step 1
            step1 = next(e.data for e in metrics if e.data["step"] == 1)
            assert (
                "reward/mean" in step1
                and "eval/reward/mean" in step1
                and "rollouts/tool_calls/mean" in step1
            )
            ckpts = client.fine_tuning.jobs.checkpoints.list(job.id)
            assert [c.step_number for c in ckpts.data] == [1]

            assert done.fine_tuned_model in [m.id for m in client.models.list()]
            reply = client.chat.completions.create(
                model=done.fine_tuned_model,
                messages=[{"role": "user", "content": "What is the capital of Kenya?"}],
                tools=[
                    {
                        "type": "function",
                        "function": {k: tools[0][k] for k in ("name", "description", "parameters")},
                    }
                ],
                max_tokens=48,
                seed=3,
                temperature=0.7,
            )
            assert reply.model == done.fine_tuned_model and reply.choices[0].finish_reason in (
                "stop",
                "tool_calls",
                "length",
            )
            assert reply.usage is not None and reply.usage.completion_tokens > 0

            graded = client.fine_tuning.alpha.graders.run(
                grader=rl["grader"],
                model_sample="The capital of Kenya is Nairobi.",
                item={"answer": "Nairobi"},
            )
            assert graded.reward == 1.0
    finally:
        service.stop()


@pytest.mark.slow  # two 3-step trainings and two server starts: minutes on a laptop CPU
def test_kill_9_mid_job_then_restart_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = ServiceProcess(data)
    try:
        with service.client() as client:
            job = create_resume_test_job(client, tmp_path, 3)
        run = data / "jobs" / job.id
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "latest").exists():
            assert time.monotonic() < deadline and service.proc.poll() is None
            time.sleep(0.02)
        service.stop(signal.SIGKILL)  # the server and, with it, its worker
        killed_at = (run / "checkpoints" / "latest").read_text()
        assert killed_at in ("step-1", "step-2"), killed_at
        time.sleep(1.0)
        assert not (run / "final").exists()

        service = ServiceProcess(data)
        with service.client() as client:
            done = wait_status(client, job.id, FINISHED, timeout_s=300, poll_s=0.5)
            assert done.status == "succeeded", done.error
            steps = sorted(
                e.data["step"]
                for e in client.fine_tuning.jobs.list_events(job.id, limit=100)
                if e.type == "metrics"
            )
            assert steps == [1, 2, 3]
    finally:
        service.stop()

    # the same job, uninterrupted, with the CLI's training entry point
    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copy(run / "job.json", ref / "job.json")
    shutil.copy(run / "training.jsonl", ref / "training.jsonl")
    from agentrft.job import load_job
    from agentrft.train.loop import train

    train(load_job(ref / "job.json"), ref / "run")
    a, b = adapter(ref / "run/checkpoints/step-3"), adapter(run / "checkpoints/step-3")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
