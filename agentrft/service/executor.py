"""Runs the service's jobs: a queue in SQLite, worker processes, and one scheduler thread.

    validating_files -> queued -> running -> succeeded | failed | cancelled
                          ^  paused <-'

Every half second the scheduler thread (the only one that starts or reaps workers):
- checks the files of new jobs and queues them (or fails them, with OpenAI's `error`);
- reaps finished workers and records their outcome from `RUN_DIR/result.json`;
- turns new lines of each running job's `metrics.jsonl` into `metrics` events;
- starts queued jobs, oldest first, while fewer than `workers` run.

A job is a process (`python -m agentrft.service.worker RUN_DIR`) in its own process group,
so cancel and pause stop it and everything it started within seconds; its checkpoints stay.
On start-up, jobs the previous server left `running` go back to the queue and resume from
their last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from agentrft.errors import ConfigError
from agentrft.service.secret_store import SecretStore
from agentrft.service.store import TERMINAL, Store

log = logging.getLogger(__name__)
STOP_GRACE_S = 3.0


def worker_environment() -> dict[str, str]:
    """The server's environment, less its API keys: a job never needs them."""
    return {k: v for k, v in os.environ.items() if k != "AGENTRFT_API_KEYS"}


class JobProcess(Protocol):
    """A running job, wherever it runs: `poll()` is its exit code once it ended, else None;
    `stop()` ends it (and everything it started) within seconds."""

    def poll(self) -> int | None: ...

    def stop(self) -> None: ...


class LocalProcess:
    """`python -m WORKER_MODULE RUN_DIR` in its own process group on this machine, given
    `job` (the job with its secrets, or None) as JSON on its stdin: never on disk."""

    def __init__(self, module: str, run_dir: Path, job: dict[str, Any] | None = None) -> None:
        self.log_file: IO[bytes] = (run_dir / "worker.log").open("ab")
        env = {
            **worker_environment(),
            "AGENTRFT_SERVICE_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, str(run_dir)],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(job).encode() if job is not None else b"")
            self.process.stdin.close()
        except BrokenPipeError:  # the worker died at once; its exit code says so
            pass

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and not self.log_file.closed:
            self.log_file.close()
        return code

    def stop(self) -> None:
        """SIGTERM to the worker's process group, SIGKILL after a grace period."""
        proc = self.process
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        if not self.log_file.closed:
            self.log_file.close()


@dataclass
class Worker:
    job_id: str
    process: JobProcess


def metrics_message(row: dict[str, Any], total_steps: int | None) -> str:
    """The one-line summary of a step's metrics, for the event's `message`."""
    step = int(row.get("step", 0))
    parts = [f"Step {step}" + (f"/{total_steps}" if total_steps else "")]
    if "reward/mean" in row:
        parts.append(f"reward={row['reward/mean']:.4f}")
    if "eval/reward/mean" in row:
        parts.append(f"eval reward={row['eval/reward/mean']:.4f}")
    if "rollouts/tool_calls/mean" in row:
        parts.append(f"tool calls/rollout={row['rollouts/tool_calls/mean']:.2f}")
    if row.get("hack_watch/flags"):
        parts.append(
            f"hack watch: {int(row['hack_watch/flags'])} flag(s), read this step's rollouts"
        )
    return ", ".join(parts)


class LocalExecutor:
    """Worker processes on this machine. `worker_module` is what `python -m` runs for a job
    (tests put a fast fake there)."""

    def __init__(
        self,
        store: Store,
        jobs_dir: Path,
        *,
        workers: int = 1,
        worker_module: str = "agentrft.service.worker",
        validate_files: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        poll_s: float = 0.5,
        secrets: SecretStore | None = None,
    ) -> None:
        self.store = store
        self.secrets = secrets
        self.jobs_dir = jobs_dir
        self.workers = max(1, workers)
        self.worker_module = worker_module
        self.validate_files = validate_files
        self.poll_s = poll_s
        self._running: dict[str, Worker] = {}
        self._stop_requests: dict[str, str] = {}  # job id -> status to set once its worker is gone
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self.secrets is not None:  # jobs that ended while a server was being killed
            for job_id in self.secrets.job_ids():
                job = self.store.job(job_id)
                if job is None or job["status"] in TERMINAL:
                    self.secrets.delete(job_id)
        for job in self.store.jobs_with_status("running"):
            self._set_status(job["id"], "queued", only_from=("running",))
            self.store.add_event(
                job["id"],
                "The server restarted; the job is queued again and resumes from its last checkpoint",
            )
        self._thread = threading.Thread(target=self._loop, name="agentrft-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the scheduler and the workers. Their jobs stay `running` in the database, so
        the next server resumes them."""
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            workers = list(self._running.values())
            self._running.clear()
        for w in workers:
            w.process.stop()

    def poke(self) -> None:
        self._wake.set()

    def _set_status(self, job_id: str, status: str, **kw: Any) -> bool:
        """`Store.set_status`; a job that ends (succeeded, failed, cancelled) no longer needs
        its secrets, so their encrypted copy is deleted with it."""
        moved = self.store.set_status(job_id, status, **kw)
        if moved and status in TERMINAL and self.secrets is not None:
            self.secrets.delete(job_id)
        return moved

    # -- requests from the API -----------------------------------------------------------
    def stop(self, job_id: str, status: str) -> None:
        """Cancel or pause: a queued job moves at once; a running one once its worker is
        killed (by the scheduler thread, within a poll)."""
        with self._lock:
            if job_id in self._running:
                self._stop_requests[job_id] = status
                self._wake.set()
                return
        self._set_status(
            job_id, status, only_from=("validating_files", "queued", "running", "paused")
        )

    def wait_stopped(self, job_id: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if job_id not in self._running:
                    return
            time.sleep(0.05)

    # -- the scheduler thread ------------------------------------------------------------
    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception:  # the scheduler must outlive one bad job; the error is logged
                log.exception("scheduler tick failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def tick(self) -> None:
        self._validate_new()
        self._handle_stops()
        self._reap()
        for job_id in list(self._running):
            self.ingest_metrics(job_id)
        self._start_queued()

    def _validate_new(self) -> None:
        for job in self.store.jobs_with_status("validating_files"):
            error = self.validate_files(job) if self.validate_files else None
            if error:
                if self._set_status(
                    job["id"], "failed", only_from=("validating_files",), error=error
                ):
                    self.store.add_event(
                        job["id"], f"File validation failed: {error['message']}", level="error"
                    )
            elif self._set_status(job["id"], "queued", only_from=("validating_files",)):
                self.store.add_event(job["id"], "Files validated, moving job to queued state")

    def _handle_stops(self) -> None:
        with self._lock:
            stops = dict(self._stop_requests)
            self._stop_requests.clear()
        for job_id, status in stops.items():
            with self._lock:
                worker = self._running.get(job_id)
            if worker is not None:
                worker.process.stop()
                self.ingest_metrics(job_id)
            if self._set_status(job_id, status, only_from=("queued", "running")):
                self.store.add_event(
                    job_id,
                    "Fine-tuning job paused" if status == "paused" else "Fine-tuning job cancelled",
                )
            with self._lock:  # only now: the API waits for this to answer with the new status
                self._running.pop(job_id, None)

    def _reap(self) -> None:
        with self._lock:
            done = [w for w in self._running.values() if w.process.poll() is not None]
            for w in done:
                del self._running[w.job_id]
        for w in done:
            self.ingest_metrics(w.job_id)
            self._record_outcome(w.job_id, w.process.poll() or 0)

    def _record_outcome(self, job_id: str, returncode: int) -> None:
        run_dir = self.jobs_dir / job_id
        try:
            result = json.loads((run_dir / "result.json").read_text())
        except (OSError, json.JSONDecodeError):
            result = {
                "error": {
                    "code": "server_error",
                    "message": f"the worker exited with code {returncode} without a result; see its log",
                }
            }
        if returncode == 0 and result.get("status") == "succeeded":
            if self._set_status(job_id, "succeeded", only_from=("running",)):
                job = self.store.job(job_id)
                self.store.add_event(
                    job_id,
                    f"New fine-tuned model created: {job['fine_tuned_model'] if job else ''}",
                )
                self.store.add_event(job_id, "The job has successfully completed")
            return
        error = {
            "code": str(result.get("error", {}).get("code", "server_error")),
            "message": str(result.get("error", {}).get("message", "")),
            "param": None,
        }
        if self._set_status(job_id, "failed", only_from=("running",), error=error):
            self.store.add_event(job_id, f"The job failed: {error['message']}", level="error")

    def _start_queued(self) -> None:
        for job in self.store.jobs_with_status("queued"):
            with self._lock:
                if len(self._running) >= self.workers:
                    return
            if not self._set_status(job["id"], "running", only_from=("queued",)):
                continue
            run_dir = self.jobs_dir / job["id"]
            resumed = (run_dir / "checkpoints" / "latest").is_file()
            (run_dir / "result.json").unlink(missing_ok=True)
            try:
                full = self.secrets.get(job["id"]) if self.secrets else None
            except ConfigError as exc:
                error = {"code": "secret_key_mismatch", "message": str(exc), "param": None}
                if self._set_status(job["id"], "failed", only_from=("running",), error=error):
                    self.store.add_event(job["id"], f"The job failed: {exc}", level="error")
                continue
            process = self.spawn(run_dir, full)
            with self._lock:
                self._running[job["id"]] = Worker(job["id"], process)
            self.store.add_event(
                job["id"],
                "Fine-tuning job resumed from its last checkpoint"
                if resumed
                else "Fine-tuning job started",
            )
            now = self.store.job(job["id"])
            if now is not None and now["status"] != "running":  # cancelled or paused while starting
                with self._lock:
                    self._stop_requests[job["id"]] = now["status"]

    def spawn(self, run_dir: Path, job: dict[str, Any] | None = None) -> JobProcess:
        """Start one job's worker, handing it `job` (with its secrets) in memory (the Ray
        executor overrides this)."""
        return LocalProcess(self.worker_module, run_dir, job)

    # -- metrics -> events ---------------------------------------------------------------
    def ingest_metrics(self, job_id: str) -> None:
        """New rows of the job's metrics.jsonl become `metrics` events (one per step; a step
        redone after a resume keeps its first event)."""
        run_dir = self.jobs_dir / job_id
        path = run_dir / "metrics.jsonl"
        job = self.store.job(job_id)
        if job is None or not path.is_file():
            return
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        seen = job["metrics_seen"] if job["metrics_seen"] <= len(lines) else 0
        if seen == len(lines):
            return
        total = total_steps(run_dir)
        for line in lines[seen:]:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line being written right now: read it next time
                break
            row = {**row, "total_steps": total} if total else row
            self.store.add_event(
                job_id,
                metrics_message(row, total),
                level="warn" if row.get("hack_watch/flags") else "info",
                kind="metrics",
                data=row,
                event_id=f"ftevent-{job_id.removeprefix('ftjob-')}-step-{row.get('step', 0)}",
            )
            seen += 1
        self.store.set_metrics_seen(job_id, seen)


def total_steps(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "hyperparameters.json").read_text())["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
