"""A command stopped with SIGTERM (a `kill`, a container stop) stops the servers it started:
the environment server of `agentrft demo`, `train` or `eval` does not outlive it, nor a SIGKILL."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def command_with_environment() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A command that started the quickstart's environment server: the process and the
    server's URL, once it answers. The command is killed at the end, whatever happened."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(QUICKSTART)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        yield proc, url
    finally:
        proc.kill()
        proc.wait()


def is_up(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.TransportError:
        return False
    return True


def test_sigterm_stops_the_environment_server_the_command_started():
    with command_with_environment() as (proc, url):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not is_up(url), f"the environment server on {url} outlived its command"


def test_a_killed_command_leaves_no_environment_server():
    """SIGKILL runs no `finally`: the kernel stops the server (PR_SET_PDEATHSIG)."""
    with command_with_environment() as (proc, url):
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while is_up(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not is_up(url), f"the environment server on {url} outlived its killed command"
