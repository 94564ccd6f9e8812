"""The sandbox's seccomp filter and its user namespace, as a hostile grader meets them: the
denied system calls fail with EPERM inside (and the same calls succeed in a sandbox built
without the filter, so it is the filter that refuses them); threads, forks and subprocesses
still work; started by root, the code runs in a user namespace of its own in which only its
uid is mapped; and a python grader still grades."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from agentrft import sandbox, syscall_filter
from agentrft.graders import build_grader, sample_from_text
from agentrft.sandbox import Limits
from tests.needs import needs_bwrap

pytestmark = needs_bwrap
FAST = Limits(cpu_s=5, wall_s=20, memory_mb=512, file_mb=16)

# name -> arguments that succeed where nothing refuses the call (or fail for another reason
# than EPERM: a null pointer, an unprivileged caller's own limits)
CALLS = {
    "ptrace": [0, 0, 0, 0],  # PTRACE_TRACEME
    "unshare": [0x10000000],  # CLONE_NEWUSER
    "keyctl": [0, -2, 1],  # KEYCTL_GET_KEYRING_ID of the process keyring, created
    "bpf": [5, 0, 0],  # BPF_PROG_LOAD with no attributes
    "io_uring_setup": [1, 0],
    "perf_event_open": [0, 0, -1, -1, 0],
    "mount": [0, 0, 0, 0, 0],
    "clone3": [0, 0],
}
# for an unprivileged uid; ptrace(TRACEME) is refused anyway when the parent (bwrap) holds
# capabilities that the code does not
SUCCEED_UNFILTERED = ("unshare", "keyctl")

PROBE = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, (number, args) in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(number), *map(ctypes.c_long, args))
    out[name] = 0 if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""


def in_sandbox(code: str, *args: str, tmp: Path) -> str:
    work = tmp / f"work-{len(list(tmp.iterdir()))}"
    work.mkdir()
    res = asyncio.run(sandbox.run_sandboxed([sys.executable, "-I", "-c", code, *args], work, FAST))
    assert res.returncode == 0, res.stderr
    return res.stdout


def errnos(tmp: Path) -> dict[str, int]:
    import pyseccomp

    arch = pyseccomp.system_arch()
    numbered = {name: (pyseccomp.resolve_syscall(arch, name), a) for name, a in CALLS.items()}
    return json.loads(in_sandbox(PROBE, json.dumps(numbered), tmp=tmp))


@pytest.fixture
def without_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sandbox, "protection", lambda: dataclasses.replace(sandbox._probe(), seccomp=False)
    )


def needs_filter() -> None:
    why = syscall_filter.unavailable()
    if why:
        pytest.skip(why)
    assert sandbox.protection().seccomp, sandbox.protection().describe()


def test_denied_system_calls_fail_inside(tmp_path: Path) -> None:
    needs_filter()
    got = errnos(tmp_path)
    want = {name: errno.EPERM for name in CALLS} | {"clone3": errno.ENOSYS}
    assert got == want, {n: os.strerror(e) if e else "succeeded" for n, e in got.items()}


def test_the_same_calls_succeed_without_the_filter(tmp_path: Path, without_filter: None) -> None:
    """The control: it is the filter, not the dropped privileges, that refuses them."""
    got = errnos(tmp_path)
    assert {n: got[n] for n in SUCCEED_UNFILTERED} == dict.fromkeys(SUCCEED_UNFILTERED, 0), got


def test_threads_forks_and_subprocesses_still_work(tmp_path: Path) -> None:
    """clone3 answers ENOSYS, so the C library falls back to clone: without that fallback
    no thread or child process could start."""
    needs_filter()
    out = in_sandbox(
        textwrap.dedent("""
            import os, subprocess, threading
            box = []
            t = threading.Thread(target=box.append, args=(1,))
            t.start(); t.join()
            pid = os.fork()
            if pid == 0:
                os._exit(7)
            _, status = os.waitpid(pid, 0)
            print(box, os.waitstatus_to_exitcode(status), subprocess.run(["true"]).returncode)
        """),
        tmp=tmp_path,
    )
    assert out.split() == ["[1]", "7", "0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="started by another user, bwrap maps the uid")
def test_started_by_root_the_code_has_a_user_namespace_of_its_own(tmp_path: Path) -> None:
    prot = sandbox.protection()
    if not prot.user_namespace:
        pytest.skip(prot.why_no_user_namespace)
    code = 'import os; print(os.readlink("/proc/self/ns/user")); print(open("/proc/self/uid_map").read())'
    ns, *uid_map = in_sandbox(code, tmp=tmp_path).split()
    assert ns != os.readlink("/proc/self/ns/user")
    inside, outside, count = map(int, uid_map)
    assert inside == outside >= 1_900_000_000 and count == 1  # only the sandbox uid, as itself


def test_a_python_grader_still_grades_under_the_filter() -> None:
    needs_filter()
    g = build_grader(
        {
            "type": "python",
            "name": "py",
            "source": "import json\ndef grade(sample, item):\n    return len(json.dumps(item)) / 100\n",
        },
        python_limits=FAST,
    )
    grade = g.grade(sample_from_text("x"), {"a": 1})
    assert grade.error is None, grade.metrics
    assert grade.score == pytest.approx(len('{"a": 1}') / 100)


def test_protection_names_the_filter_and_the_namespace() -> None:
    text = sandbox.protection().describe()
    assert ("a seccomp filter refuses" in text) or ("no seccomp filter (" in text)
    assert ("a user namespace of its own" in text) or ("the host's user namespace (" in text)
