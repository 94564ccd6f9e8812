"""Start an environment server (any ASGI app: a job's `agentrft.environment`) for a run, and
stop it after: `launch_environment`; agentrft.runtime.job_environment starts a job's.

It runs as a subprocess (its own interpreter, so tool work never competes with sampling for
the GIL) on loopback. agentrft waits until it answers HTTP, and always stops it. Each start
makes a fresh shared token (`AGENTRFT_ENV_TOKEN` for the server; agentrft sends it on every
request to it, see `env_token.py`), unless the job's `env` sets one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from agentrft.errors import ConfigError
from agentrft.lifetime import die_with_parent
from agentrft.tools.env_token import TOKEN_ENV, launched
from agentrft.tools.envkit import free_port


@contextlib.contextmanager
def launch_environment(
    app: str,
    base_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Yields the server's base URL (http://host:port). Its output goes to `log_path`
    (default: a temporary file), whose tail is shown if it fails to start."""
    port = port or free_port(host)
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--host",
        host,
        "--port",
        str(port),
        "--app-dir",
        str(base_dir),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    child_env = {**os.environ, TOKEN_ENV: secrets.token_urlsafe(32), **(env or {})}
    log = open(log_path, "w") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd,
        cwd=base_dir,
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=die_with_parent,  # stopped even when agentrft is killed
    )
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                log.flush()
                if log_path:
                    err = Path(log_path).read_text()
                else:
                    log.seek(0)
                    err = log.read()
                raise ConfigError(
                    f"environment server {app!r} exited at start (code {proc.returncode}):\n{err[-2000:]}"
                )
            try:
                httpx.get(url + "/health", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"environment server {app!r} did not answer on {url} within {startup_timeout_s:g}s"
                    ) from None
                time.sleep(0.1)
        with launched(url, child_env[TOKEN_ENV]):
            yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
