"""A command stopped with SIGTERM (a `kill`, a container stop) stops the servers it started:
the environment server of `agentrft demo`, `train` or `eval` does not outlive it, nor a SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"

SCRIPT = """
import sys, time
from pathlib import Path
from agentrft.cli.main import _exit_on_sigterm
from agentrft.tools.launch import launch_environment
with _exit_on_sigterm(), launch_environment("env:app", Path(sys.argv[1])) as url:
    print(url, flush=True)
    time.sleep(120)
"""


def test_sigterm_stops_the_environment_server_the_command_started():
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(QUICKSTART)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        try:
            httpx.get(url + "/health", timeout=2)
            still_up = True
        except httpx.TransportError:
            still_up = False
        assert not still_up, f"the environment server on {url} outlived its command"
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_command_leaves_no_environment_server():
    """SIGKILL runs no `finally`: the kernel stops the server (PR_SET_PDEATHSIG)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(QUICKSTART)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/health", timeout=2)
            except httpx.TransportError:
                return
            time.sleep(0.2)
        raise AssertionError(f"the environment server on {url} outlived its killed command")
    finally:
        proc.kill()
        proc.wait()
