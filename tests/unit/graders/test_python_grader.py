"""python graders run in bubblewrap: scores come back; crashes, loops, memory hogs, network
and writes outside the sandbox are stopped and flagged, never scored."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import textwrap
import threading
from pathlib import Path

import pytest

from agentrft import sandbox
from agentrft.errors import ConfigError, SandboxUnavailable
from agentrft.graders import build_grader, sample_from_text
from agentrft.sandbox import Limits
from tests.needs import needs_bwrap

FAST = Limits(cpu_s=2, wall_s=10, memory_mb=512, file_mb=16)


def run(source: str, output: str = "hello", item: dict | None = None, limits: Limits = FAST):
    g = build_grader(
        {"type": "python", "name": "py", "source": textwrap.dedent(source)}, python_limits=limits
    )
    return g.grade(sample_from_text(output), item or {})


@needs_bwrap
def test_score_from_sample_and_item() -> None:
    grade = run(
        """
        def grade(sample, item):
            return float(sample["output_text"] == item["answer"]) * 0.75
    """,
        "Paris",
        {"answer": "Paris"},
    )
    assert grade.error is None
    assert grade.score == 0.75


@needs_bwrap
def test_graders_can_use_installed_libraries() -> None:
    grade = run("""
        from rapidfuzz import fuzz
        def grade(sample, item):
            return fuzz.ratio(sample["output_text"], "hello") / 100
    """)
    assert grade.score == 1.0


@needs_bwrap
@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def grade(sample, item):\n    return 1 / 0\n", "ZeroDivisionError"),
        ("def grade(sample, item):\n    return 'high'\n", "must be a number"),
        ("def grade(sample, item):\n    return None\n", "must be a number"),
        ("def grade(sample, item):\n    return float('nan')\n", "finite"),
        ("def grade(sample, item):\n    import sys; sys.exit(0)\n", "SystemExit"),
        ("import os\ndef grade(sample, item):\n    os._exit(3)\n", "died (exit 3)"),
    ],
)
def test_runtime_errors_are_flagged(source: str, needle: str) -> None:
    grade = run(source)
    assert grade.error == "python_grader_runtime_error"
    assert math.isnan(grade.score)
    assert needle in grade.metrics["error_details"]


@needs_bwrap
def test_infinite_loop_is_stopped_at_the_cpu_limit() -> None:
    grade = run(
        "def grade(sample, item):\n    while True:\n        pass\n",
        limits=Limits(cpu_s=1, wall_s=20, memory_mb=512),
    )
    assert grade.error == "python_grader_timeout"
    assert "CPU limit of 1s" in grade.metrics["error_details"]
    assert grade.metrics["execution_time"] < 10


@needs_bwrap
def test_sleeping_grader_is_stopped_at_the_wall_clock_limit() -> None:
    grade = run(
        "import time\ndef grade(sample, item):\n    time.sleep(60)\n",
        limits=Limits(cpu_s=5, wall_s=1.5, memory_mb=512),
    )
    assert grade.error == "python_grader_timeout"
    assert "wall-clock" in grade.metrics["error_details"]
    assert grade.metrics["execution_time"] < 10


@needs_bwrap
def test_memory_hog_is_stopped() -> None:
    grade = run(
        "def grade(sample, item):\n    blob = bytearray(2 << 30)\n    return 1.0\n",
        limits=Limits(cpu_s=5, wall_s=20, memory_mb=300),
    )
    assert grade.error == "python_grader_runtime_error"
    assert "MemoryError" in grade.metrics["error_details"]
    assert "300 MB" in grade.metrics["error_details"]


@needs_bwrap
def test_no_network_even_to_the_hosts_loopback() -> None:
    """A listener on the host's 127.0.0.1 is unreachable from inside the sandbox."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        # the same code run outside the sandbox does connect: the probe itself works
        probe = f"""
            import socket
            def grade(sample, item):
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                    return 1.0
                except OSError:
                    return 0.0
        """
        grade = run(probe)
        assert grade.error is None
        assert grade.score == 0.0
        assert not accepted
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        t.join(timeout=5)
        assert accepted  # control: reachable from the host
    finally:
        server.close()


@needs_bwrap
def test_writes_only_inside_the_sandbox_directory(tmp_path: Path) -> None:
    home_target = Path.cwd() / "agentrft-sandbox-escape.txt"  # the repository: read-only inside
    tmp_target = tmp_path / "escape.txt"  # host /tmp: the sandbox has its own private /tmp
    grade = run(f"""
        import os
        def grade(sample, item):
            open("inside.txt", "w").write("ok")          # the sandbox dir is writable
            assert open("inside.txt").read() == "ok"
            for path in ({str(home_target)!r}, {str(tmp_target)!r}):
                try:
                    with open(path, "w") as fh:
                        fh.write("escaped")   # refused, or lands in the private /tmp
                except OSError:
                    pass
            try:
                open("/etc/agentrft-escape", "w")
            except OSError:
                return 1.0  # the root file system is read-only
            return 0.0
    """)
    assert grade.error is None
    assert grade.score == 1.0
    assert not home_target.exists()  # nothing reached the host, wherever the checkout lives
    assert not tmp_target.exists()
    assert not Path("/etc/agentrft-escape").exists()


def test_missing_bwrap_refuses_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._probe.cache_clear()
    try:
        g = build_grader({"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"})
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            g.grade(sample_from_text("x"), {})
    finally:
        sandbox._probe.cache_clear()


@needs_bwrap
def test_concurrent_graders_in_one_event_loop() -> None:
    g = build_grader(
        {
            "type": "python",
            "source": "def grade(sample, item):\n    return len(sample['output_text']) / 10\n",
        },
        python_limits=FAST,
    )

    async def main() -> list[float]:
        grades = await asyncio.gather(*(g.agrade(sample_from_text("x" * i), {}) for i in range(6)))
        return [gr.score for gr in grades]

    assert asyncio.run(main()) == [i / 10 for i in range(6)]


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("def grade(sample, item)\n    return 1", "not valid Python"),
        ("def score(sample, item):\n    return 1", "define a top-level function"),
        ("def grade(sample):\n    return 1", "exactly two arguments"),
        ("x = 1\n" * 60000, "over 256 KiB"),
    ],
)
def test_source_is_checked_at_validation(source: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_grader({"type": "python", "source": source})


@needs_bwrap
def test_an_interpreter_installed_under_tmp_still_runs(tmp_path: Path) -> None:
    """A checkout (and its .venv) under /tmp: the sandbox's private /tmp must not hide it."""
    import subprocess
    import sys

    venv = tmp_path / "checkout" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    res = asyncio.run(
        sandbox.run_sandboxed(
            [str(venv / "bin" / "python"), "-I", "-c", "import sys; print(sys.prefix)"], work, FAST
        )
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(venv)
    assert "--ro-bind" in sandbox.bwrap_argv(work, [str(venv / "bin" / "python")])
