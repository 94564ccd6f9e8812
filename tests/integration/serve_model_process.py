"""`agentrft serve-model` started as a user starts it, in its own process, for the tests that
need a real port and a real process (cancellation, signals, the CLI, load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from agentrft.tools.envkit import free_port

START_S = 240  # loading the 135M model on a busy 2-core machine


@contextmanager
def serve_model_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `agentrft serve-model base ARGS...` on a free loopback port, wait for /health,
    yield (process, base url); stop it afterwards (SIGTERM, then SIGKILL after 30 s)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrft.cli", "serve-model", "base", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    try:
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve-model did not start"
                time.sleep(0.5)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(timeout=30)
