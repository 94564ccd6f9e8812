"""Fault injection against the sandbox, as a hostile grader would try it. Run as root (as on
many CI machines and in containers), the grader must not remount, unmount or write to the
host, read root-only files or reach the network; forks, total memory and CPU time are
capped for the whole sandbox; the limits come from the job's grader and from the CLI."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from agentrft import sandbox
from agentrft.cli import main
from agentrft.graders import build_grader, sample_from_text
from agentrft.sandbox import Limits
from tests.needs import needs_bwrap

pytestmark = needs_bwrap
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the root-specific escapes need root")
FAST = Limits(cpu_s=5, wall_s=20, memory_mb=512, file_mb=16)


def needs_cgroup() -> None:
    if sandbox.protection().cgroup is None:
        pytest.skip(f"no cgroup here: {sandbox.protection().describe()}")


def run(source: str, item: dict | None = None, limits: Limits = FAST, **spec):
    g = build_grader(
        {"type": "python", "name": "py", "source": textwrap.dedent(source), **spec},
        python_limits=limits,
    )
    return g.grade(sample_from_text("x"), item or {})


@as_root
def test_no_remount_unmount_or_write_to_the_host(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    host.chmod(0o777)  # even a directory anyone may write to stays out of reach
    grade = run(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
        def grade(sample, item):
            escaped = 0
            escaped |= (libc.umount2(b"/tmp", MNT_DETACH) == 0) << 0            # reveal the host's /tmp
            escaped |= (libc.mount(b"none", item["dir"].encode(), None, MS_REMOUNT | MS_BIND, None) == 0) << 1
            escaped |= (libc.mount(b"none", b"/", None, MS_REMOUNT | MS_BIND, None) == 0) << 2
            try:
                with open(os.path.join(item["dir"], "escape.txt"), "w") as fh:
                    fh.write("out")
                escaped |= 1 << 3
            except OSError:
                pass
            return float(escaped)
    """,
        {"dir": str(host)},
    )
    assert grade.error is None, grade.metrics
    assert grade.score == 0.0, f"escape bits {grade.score:g}"
    assert not (host / "escape.txt").exists()


@as_root
def test_no_read_of_root_only_files() -> None:
    if not Path("/etc/shadow").exists():
        pytest.skip("no /etc/shadow here")
    grade = run("""
        def grade(sample, item):
            try:
                open("/etc/shadow").read()
                return 1.0
            except OSError:
                return 0.0
    """)
    assert grade.error is None, grade.metrics
    assert grade.score == 0.0


@as_root
def test_no_capabilities_and_not_root_inside() -> None:
    grade = run("""
        import os
        def grade(sample, item):
            caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")]
            return float(os.getuid() == 0 or any(int(c, 16) for c in caps))
    """)
    assert grade.error is None, grade.metrics
    assert grade.score == 0.0


def test_no_network() -> None:
    grade = run("""
        import socket
        def grade(sample, item):
            for family, addr in ((socket.AF_INET, ("1.1.1.1", 53)), (socket.AF_INET, ("127.0.0.1", 22))):
                try:
                    socket.create_connection(addr, timeout=1).close()
                    return 1.0
                except OSError:
                    pass
            return 0.0
    """)
    assert grade.error is None, grade.metrics
    assert grade.score == 0.0


def test_forks_are_capped() -> None:
    if sandbox.protection().cgroup is None and os.geteuid() != 0:
        pytest.skip(
            "without a cgroup, forks are capped only for root (RLIMIT_NPROC under the sandbox uid)"
        )
    grade = run(
        """
        import os, time
        def grade(sample, item):
            children = []
            for _ in range(200):
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    time.sleep(5)
                    os._exit(0)
                children.append(pid)
            return float(len(children))
    """,
        limits=Limits(cpu_s=5, wall_s=20, memory_mb=512, pids=16),
    )
    assert grade.error is None, grade.metrics
    assert grade.score < 16


def test_total_memory_is_capped_across_processes() -> None:
    """Three processes of 200 MB each stay within a 300 MB limit per process, but not
    within 300 MB for the sandbox."""
    needs_cgroup()
    grade = run(
        """
        import os
        def grade(sample, item):
            pids = []
            for _ in range(3):
                pid = os.fork()
                if pid == 0:
                    blob = bytearray(200 << 20)
                    for i in range(0, len(blob), 4096):
                        blob[i] = 1
                    os.read(os.open("/dev/zero", os.O_RDONLY), 1)
                    import time; time.sleep(2)
                    os._exit(0)
                pids.append(pid)
            return float(sum(os.waitpid(p, 0)[1] == 0 for p in pids))
    """,
        limits=Limits(cpu_s=10, wall_s=30, memory_mb=300),
    )
    assert grade.error is not None or grade.score < 3, (
        "all three held 200 MB each under a 300 MB limit"
    )


def test_cpu_time_is_capped_for_the_whole_sandbox() -> None:
    """Two busy processes of 1.5 CPU seconds each pass a 2 s limit per process but not 2 s
    for the sandbox."""
    needs_cgroup()
    grade = run(
        """
        import os, time
        def burn(seconds):
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
        def grade(sample, item):
            pid = os.fork()
            burn(1.5)
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            return 1.0
    """,
        limits=Limits(cpu_s=2, wall_s=30, memory_mb=512),
    )
    assert grade.error == "python_grader_timeout", grade.metrics


def test_limits_come_from_the_grader_in_the_job() -> None:
    grade = run(
        "import time\ndef grade(sample, item):\n    time.sleep(30)\n",
        limits=Limits(),
        agentrft={"sandbox": {"wall_s": 1, "cpu_s": 1}},
    )
    assert grade.error == "python_grader_timeout"
    assert "wall-clock limit of 1s" in grade.metrics["error_details"]
    assert grade.metrics["execution_time"] < 10


def test_limits_come_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "grader.json"
    spec.write_text(
        json.dumps(
            {
                "type": "python",
                "source": "def grade(sample, item):\n    while True:\n        pass\n",
            }
        )
    )
    rc = main(
        [
            "grader",
            "run",
            str(spec),
            "--model-sample",
            "x",
            "--json",
            "--cpu-s",
            "1",
            "--wall-s",
            "15",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["metadata"]["error"] == "python_grader_timeout"
    assert "CPU limit of 1s" in out["metadata"]["metrics"]["error_details"]


def test_protection_says_what_holds() -> None:
    text = sandbox.protection().describe()
    assert text.startswith("sandbox: bubblewrap")
    assert ("cgroup v" in text) or ("no cgroup" in text and "per process" in text)


def test_limits_come_from_the_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job's `agentrft.sandbox` sets the defaults of every python grader in it (what
    training and evaluation build), a grader's own settings win, and the OpenAI part of the
    job stays as it was."""
    from agentrft.job import load_job

    grader = {
        "type": "python",
        "source": "import time\ndef grade(sample, item):\n    time.sleep(30)\n",
    }
    job = {
        "training_file": "train.jsonl",
        "method": {"type": "reinforcement", "reinforcement": {"grader": grader}},
        "agentrft": {"sandbox": {"wall_s": 1, "memory_mb": 300}},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    assert load_job(path).agentrft.sandbox.limits() == Limits(wall_s=1, memory_mb=300)
    rc = main(["grader", "run", str(path), "--job", str(path), "--model-sample", "x", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["metadata"]["error"] == "python_grader_timeout"
    assert "wall-clock limit of 1s" in out["metadata"]["metrics"]["error_details"]
