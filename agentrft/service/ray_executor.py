"""`agentrft serve --executor ray`: each job runs as a Ray task instead of a local process.

The API, the queue and the scheduler are the local executor's (`executor.py`); only where a
job's worker runs changes. The task starts the same worker (`python -m
agentrft.service.worker RUN_DIR`) on a Ray node, so the node needs agentrft installed and
the data directory at the same path (one machine, or a shared file system). Cancel and pause
cancel the task (`ray.cancel(force=True)`); the worker dies with it. Tasks belong to the
server (the Ray driver), so they end with it and resume, like local ones, after a restart.

Without `--ray-address` the server starts a local Ray for itself and stops it on exit.
Ray is imported only here, and only for `--executor ray`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrft.errors import ConfigError
from agentrft.service.executor import LocalExecutor, worker_environment


def run_worker(
    module: str, run_dir: str, env: dict[str, str], job: dict[str, Any] | None = None
) -> int:
    """The Ray task: the worker process, with this task's process as the parent it dies with,
    given `job` (with its secrets) on its stdin."""
    full_env = {
        **worker_environment(),
        **env,
        "AGENTRFT_SERVICE_PID": str(os.getpid()),
        "PYTHONUNBUFFERED": "1",
    }
    with open(Path(run_dir) / "worker.log", "ab") as log:
        return subprocess.run(
            [sys.executable, "-m", module, run_dir],
            stdout=log,
            stderr=subprocess.STDOUT,
            input=json.dumps(job).encode() if job is not None else b"",
            env=full_env,
            check=False,
        ).returncode


class RayProcess:
    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.code: int | None = None

    def poll(self) -> int | None:
        import ray

        if self.code is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                try:
                    self.code = int(ray.get(self.ref))
                except (
                    ray.exceptions.TaskCancelledError,
                    ray.exceptions.WorkerCrashedError,
                    ray.exceptions.RayTaskError,
                ):
                    self.code = -9
        return self.code

    def stop(self) -> None:
        import ray

        if self.poll() is None:
            ray.cancel(self.ref, force=True)
            with contextlib.suppress(Exception):  # cancelled: the expected outcome
                ray.get(self.ref, timeout=15)
            self.code = -9


class RayExecutor(LocalExecutor):
    """LocalExecutor whose workers are Ray tasks (`num_cpus` each)."""

    def __init__(
        self, *args: Any, address: str | None = None, num_cpus: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install 'ray>=2.40'") from None
        self.address = address
        self.num_cpus = num_cpus
        self._ray = ray
        self._task: Any = None

    def start(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            ray.init(
                address=self.address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        self._task = ray.remote(num_cpus=self.num_cpus, max_retries=0)(run_worker)
        super().start()

    def shutdown(self) -> None:
        super().shutdown()
        if self._ray.is_initialized():
            self._ray.shutdown()

    def spawn(self, run_dir: Path, job: dict[str, Any] | None = None) -> RayProcess:
        env = {
            k: os.environ[k] for k in ("PYTHONPATH", "AGENTRFT_CACHE", "HOME") if k in os.environ
        }
        return RayProcess(self._task.remote(self.worker_module, str(run_dir), env, job))
