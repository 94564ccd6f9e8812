"""Run untrusted code inside bubblewrap: python graders now, model-triggered commands later.

    bwrap --ro-bind / / --tmpfs /tmp --dev /dev --proc /proc --unshare-{net,pid,ipc,uts,...}
          --die-with-parent --new-session --bind WORKDIR WORKDIR --chdir WORKDIR -- ARGV...

gives a read-only root, a private /tmp, no network (its own empty network namespace) and
one writable directory. On top of that:

- **No privileges.** Started by root, bwrap builds the mounts, then the code runs as a fresh
  unprivileged uid (one per sandbox) with every capability, the bounding set included,
  dropped: it cannot remount, unmount or read root-only files such as /etc/shadow.
  Directories the uid could not reach (an interpreter under /root) are bound back
  read-only over an empty tmpfs. The code then enters a user namespace of its own (where
  the kernel allows it) with only that uid mapped. Started by anyone else, bwrap puts the
  code in a user namespace without capabilities.
- **A seccomp filter** (syscall_filter.py, `bwrap --seccomp FD`) refuses ptrace, mounts,
  new namespaces, keyrings, bpf, io_uring and the like.
- **Limits for the whole sandbox.** A cgroup (v2, or v1 where that is what the host has)
  caps memory and processes for everything inside together, and its CPU time is watched.
  Without one, the limits fall back to rlimits per process (RLIMIT_CPU, RLIMIT_AS) plus
  RLIMIT_NPROC under the sandbox's own uid (root only). `protection()` says which holds.
- A wall-clock timeout kills the whole group; RLIMIT_FSIZE bounds each file written.

Where bwrap is missing or cannot build a sandbox, `SandboxUnavailable` is raised with the
fix: untrusted code never runs unisolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrft import cgroups, syscall_filter
from agentrft.errors import SandboxUnavailable

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install bubblewrap   (or `make sandbox`)"
_KEEP_BYTES = 8192  # of stdout/stderr, from the end
_UID_BASE = 1_900_000_000  # sandbox uids: far from real accounts and from /etc/subuid ranges
_POLL_S = 0.1

# Runs inside the sandbox as root (started by root), before the untrusted program: become the
# sandbox uid, drop every capability and refuse to go on if any is left. With USERNS=1 it then
# enters a user namespace of its own in which only that uid is mapped (it gives every
# capability back, inside the namespace: they are dropped again), and with a FILTER (hex) it
# loads that seccomp program on top of bwrap's, which must let its own `unshare` through.
_DROP = r"""
import ctypes, os, sys
uid, cwd, userns, inner = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", bytes.fromhex(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
def refuse(why):
    sys.stderr.write(f"agentrft sandbox: {why}; refusing to run\n")
    sys.exit(125)
def drop_capabilities():
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
os.setgroups([])
os.setresgid(uid, uid, uid)
drop_capabilities()
os.setresuid(uid, uid, uid)
if userns:
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        refuse(f"could not enter a user namespace: {os.strerror(ctypes.get_errno())}")
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self is root's since setresuid, until then
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{uid} {uid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(line)
    drop_capabilities()
libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)())
caps = [line.split(":")[1] for line in open("/proc/self/status") if line.startswith("Cap")]
if 0 in os.getresuid() or any(int(c, 16) for c in caps):
    refuse("could not drop root's privileges")
if inner:
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.byref(Program(len(inner) // 8, inner)), 0, 0) != 0:  # PR_SET_SECCOMP
        refuse(f"could not load the seccomp filter: {os.strerror(ctypes.get_errno())}")
os.chdir(cwd)
os.execvp(sys.argv[5], sys.argv[5:])
"""


@dataclass(frozen=True)
class Limits:
    """Defaults follow OpenAI's python graders: 2 minutes, 2 GB of memory, 1 GB of disk.

    With a cgroup, `memory_mb`, `pids` and `cpu_s` hold for the whole sandbox together;
    without one, memory and CPU time hold per process (see `protection()`)."""

    cpu_s: int = 120
    wall_s: float = 300.0  # above cpu_s: concurrent sandboxes share the cores
    memory_mb: int = 2048
    file_mb: int = 1024
    pids: int = 64  # processes and threads at once


@dataclass(frozen=True)
class Result:
    returncode: int | None  # None: killed at the wall-clock limit
    stdout: str  # the last 8 KiB
    stderr: str
    wall_s: float
    wall_timeout: bool
    cpu_limit: bool  # killed by RLIMIT_CPU (SIGXCPU, then SIGKILL) or at the group's CPU time
    memory_limit: bool = False  # killed by the cgroup's out-of-memory killer

    @property
    def timed_out(self) -> bool:
        return self.wall_timeout or self.cpu_limit


@dataclass(frozen=True)
class Protection:
    """What isolation holds on this machine (see the module docstring)."""

    drops_root: bool  # started by root: the code runs as a fresh unprivileged uid
    cgroup: str | None  # "v2", "v1" or None
    why_no_cgroup: str = ""
    seccomp: bool = False  # the system calls of syscall_filter.DENIED are refused
    why_no_seccomp: str = ""
    user_namespace: bool = False  # the code runs in a user namespace of its own
    why_no_user_namespace: str = ""

    def describe(self) -> str:
        who = (
            "code runs as a fresh unprivileged uid with no capabilities"
            if self.drops_root
            else "code runs with no capabilities"
        )
        who += (
            ", in a user namespace of its own"
            if self.user_namespace
            else f", in the host's user namespace ({self.why_no_user_namespace})"
        )
        calls = (
            "a seccomp filter refuses ptrace, mount, unshare, keyctl, bpf, io_uring and more"
            if self.seccomp
            else f"no seccomp filter ({self.why_no_seccomp})"
        )
        if self.cgroup:
            caps = (
                f"a cgroup {self.cgroup} caps memory, processes and CPU time for the whole sandbox"
            )
        else:
            nproc = (
                "processes capped by RLIMIT_NPROC under the sandbox uid"
                if self.drops_root
                else "the number of processes is not capped"
            )
            caps = f"no cgroup ({self.why_no_cgroup}): memory and CPU time are limited per process only, {nproc}"
        return f"sandbox: bubblewrap; {who}; {calls}; {caps}"


def _needed_dirs(argv: Sequence[str]) -> set[str]:
    """This interpreter's installation (a virtualenv, its base Python), the folder agentrft
    itself is imported from (a checkout with an editable install: a grader's code imports
    agentrft and a recipe's own modules), and, for a program given by path, its
    installation prefix (bin/..): the sandbox must see them."""
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        str(Path(__file__).resolve().parent.parent),
    }
    if argv and os.path.isabs(argv[0]):
        candidates.add(str(Path(argv[0]).parent.parent))
        candidates.add(os.path.dirname(os.path.realpath(argv[0])))
    return candidates


def _outermost(paths: set[str]) -> list[str]:
    found = sorted(paths)
    return [c for c in found if not any(Path(o) in Path(c).parents for o in found)]


def _closed_ancestor(path: str) -> str | None:
    """The outermost directory above `path` that other users cannot enter (e.g. /root)."""
    for parent in reversed(Path(path).parents):
        if str(parent) == "/":
            continue
        with contextlib.suppress(OSError):
            if not os.stat(parent).st_mode & 0o001:
                return str(parent)
    return None


def _hidden_and_visible(
    workdir: Path, argv: Sequence[str], drops_root: bool
) -> tuple[list[str], list[str]]:
    """Directories covered by an empty tmpfs (/tmp, and where the sandbox uid could not
    enter anyway) and the needed directories under them, bound back read-only."""
    needed = _needed_dirs(argv)
    hidden = {"/tmp"}
    if drops_root:
        hidden.update(a for a in map(_closed_ancestor, [*needed, str(workdir)]) if a)
    under = {c for c in needed if any(Path(h) in Path(c).parents for h in hidden)}
    return _outermost(hidden), _outermost(under)


def bwrap_argv(
    workdir: Path,
    argv: Sequence[str],
    uid: int | None = None,
    *,
    seccomp_fd: int | None = None,
    user_namespace: bool = False,
) -> list[str]:
    """The bwrap command line. `uid`: run `argv` as this unprivileged uid (bwrap itself
    runs as root and drops to it inside, entering a user namespace of its own there with
    `user_namespace`); None: bwrap's own user namespace. `seccomp_fd`: a file descriptor
    open on `seccomp_program(uid)`, for bwrap to load (the caller passes it through)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(
            f"untrusted code runs only inside bubblewrap, which is not installed. Install it:\n  {INSTALL_HINT}"
        )
    w = str(workdir)
    hidden, visible = _hidden_and_visible(workdir, argv, uid is not None)
    drop = uid is not None
    # as root, /tmp must be writable by the sandbox uid (--perms needs bubblewrap >= 0.6; a
    # user's own sandbox keeps the plain tmpfs it owns, which older versions build too)
    cover = [
        arg
        for d in hidden
        for arg in (["--perms", "1777"] if d == "/tmp" and drop else []) + ["--tmpfs", d]
    ]
    keep = [arg for d in visible for arg in ("--ro-bind", d, d)]
    # as root, bwrap creates the directories leading to a bind as 0700: the sandbox uid must pass
    steps = (
        sorted(
            {
                str(a)
                for d in [*visible, w]
                for a in Path(d).parents
                if any(Path(h) in a.parents for h in hidden)
            }
        )
        if drop
        else []
    )
    paths = [arg for d in steps for arg in ("--perms", "0755", "--dir", d)]
    if uid is None:
        namespaces = ["--unshare-all", "--cap-drop", "ALL"]
        run = list(argv)
    else:  # no user namespace: it would map the code's uid back to root on the host
        namespaces = [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--cap-add",
            "CAP_SETPCAP",
        ]
        inner = syscall_filter.unshare_program() if seccomp_fd is not None else b""
        run = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _DROP,
            str(uid),
            w,
            "1" if user_namespace else "0",
            inner.hex(),
            *argv,
        ]  # it enters `w` as the uid
    return [
        exe,
        "--ro-bind",
        "/",
        "/",
        *cover,
        *paths,
        *keep,
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *namespaces,
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--die-with-parent",
        "--new-session",
        "--bind",
        w,
        w,
        *(["--chdir", w] if uid is None else []),
        "--",
        *run,
    ]


def _set_limits(limits: Limits, group: cgroups.Group | None, uid: int | None) -> None:
    """In the child, before exec: the limits bind bwrap and everything it starts."""
    if group is not None:
        group.join()
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    mem = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    size = limits.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:  # counts the sandbox uid's processes only: one fresh uid per sandbox
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.pids, limits.pids))


def _sandbox_uid() -> int | None:
    return _UID_BASE + random.randrange(1_000_000) if os.geteuid() == 0 else None


def seccomp_program(uid: int | None) -> bytes:
    """The BPF program bwrap loads: the whole filter, or, for a sandbox started by root (which
    makes its own user namespace after bwrap starts it), all of it but `unshare`."""
    return syscall_filter.program(unshare=uid is None)


@contextlib.contextmanager
def _program_fd(program: bytes | None) -> Iterator[int | None]:
    """A file descriptor open on `program`, at offset 0, for `bwrap --seccomp FD`."""
    if program is None:
        yield None
        return
    fd = os.memfd_create("agentrft-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _try_sandbox(uid: int | None, seccomp: bool, user_namespace: bool) -> str | None:
    """Run `true` in a sandbox built so; None when it ran, else bwrap's (or _DROP's) error."""
    with tempfile.TemporaryDirectory(prefix="agentrft-probe-") as tmp:
        if uid is not None:
            _hand_over(Path(tmp), uid)
        with _program_fd(seccomp_program(uid) if seccomp else None) as fd:
            argv = bwrap_argv(
                Path(tmp), ["true"], uid, seccomp_fd=fd, user_namespace=user_namespace
            )
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=30,
                pass_fds=() if fd is None else (fd,),
            )
    return (
        None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")[:300]
    )


@functools.lru_cache(maxsize=1)
def _probe() -> Protection | str:
    """The protection a sandbox gets here, or why none can be built. It first tries every
    protection, then goes without a user namespace (started by root), then without seccomp,
    and says why each one it left out failed."""
    uid = _sandbox_uid()
    why_no_seccomp = syscall_filter.unavailable() or ""
    seccomp = not why_no_seccomp
    # started by anyone else, bwrap's own user namespace is the only way it builds a sandbox
    user_namespace, why_no_userns = True, ""
    try:
        error = _try_sandbox(uid, seccomp, user_namespace)
    except SandboxUnavailable as exc:  # no bwrap
        return str(exc)
    if error and uid is not None:
        user_namespace, why_no_userns = False, f"the kernel refused one: {error}"
        error = _try_sandbox(uid, seccomp, user_namespace)
    if error and seccomp:
        seccomp, why_no_seccomp = False, f"bubblewrap could not load it: {error}"
        error = _try_sandbox(uid, seccomp, user_namespace)
    if error:
        return (
            f"bubblewrap is installed but cannot create a sandbox here: {error}. "
            "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root."
        )
    try:
        group = cgroups.create(64 << 20, 8)
    except OSError as exc:
        cgroup, why_no_cgroup = None, str(exc.strerror or exc)
    else:
        group.remove()
        cgroup, why_no_cgroup = group.version, ""
    prot = Protection(
        uid is not None,
        cgroup,
        why_no_cgroup,
        seccomp,
        why_no_seccomp,
        user_namespace,
        why_no_userns,
    )
    partial = (
        prot.cgroup is None
        or not prot.seccomp
        or not prot.user_namespace
        or (os.geteuid() == 0 and not prot.drops_root)
    )
    log.log(logging.WARNING if partial else logging.INFO, prot.describe())
    return prot


def protection() -> Protection:
    """What isolation a sandbox gets here (logged once, as a warning where it is partial).
    Raises SandboxUnavailable (with the fix) where no sandbox can be built."""
    prot = _probe()
    if isinstance(prot, str):
        raise SandboxUnavailable(prot)
    return prot


def announce() -> None:
    """Log once which protection a sandbox gets here (or why none can be built), without
    raising: for the start of a run, before any untrusted code is due."""
    prot = _probe()
    if isinstance(prot, str):
        log.warning("sandbox unavailable, python graders will refuse to run: %s", prot)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _KEEP_BYTES))
        return fh.read().decode("utf-8", "replace")


def _hand_over(workdir: Path, uid: int) -> None:
    """Give the sandbox uid the working directory and what the caller put in it."""
    for root, dirs, files in os.walk(workdir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, uid)


async def run_sandboxed(
    argv: Sequence[str], workdir: Path, limits: Limits, env: dict[str, str] | None = None
) -> Result:
    """Run `argv` in a sandbox whose only writable directory is `workdir`. Started by root,
    `workdir` and everything in it are handed to the sandbox's uid first: give it a
    directory made for the run (a copy of a workspace, not the original)."""
    prot = protection()
    uid = _sandbox_uid() if prot.drops_root else None
    if uid is not None:
        await asyncio.to_thread(_hand_over, workdir, uid)
    group = None
    if prot.cgroup:
        try:
            group = cgroups.create(limits.memory_mb << 20, limits.pids)
        except OSError as exc:
            log.warning("sandbox: no cgroup for this run (%s): limits hold per process only", exc)
    out, err = workdir / ".stdout", workdir / ".stderr"
    t0 = time.perf_counter()
    rc: int | None = None
    wall_timeout = group_cpu = False
    program = seccomp_program(uid) if prot.seccomp else None
    try:
        with out.open("wb") as fo, err.open("wb") as fe, _program_fd(program) as fd:
            cmd = bwrap_argv(workdir, argv, uid, seccomp_fd=fd, user_namespace=prot.user_namespace)
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                start_new_session=True,
                env=env if env is not None else _default_env(workdir),
                preexec_fn=functools.partial(_set_limits, limits, group, uid),
                pass_fds=() if fd is None else (fd,),
            )
            try:
                while True:
                    with contextlib.suppress(TimeoutError):
                        rc = await asyncio.wait_for(proc.wait(), _POLL_S)
                        break
                    if group is not None and group.cpu_seconds() > limits.cpu_s:
                        group_cpu = True
                    elif time.perf_counter() - t0 > limits.wall_s:
                        wall_timeout = True
                    else:
                        continue
                    _kill(proc.pid, group)
                    await proc.wait()
                    rc = None if wall_timeout else proc.returncode
                    break
            except asyncio.CancelledError:
                _kill(proc.pid, group)
                await proc.wait()
                raise
        memory_limit = group is not None and group.oom_killed()
    finally:
        if group is not None:
            await asyncio.to_thread(group.remove)
    # bwrap reports a child killed by signal S as 128 + S
    killed = rc is not None and rc in (
        128 + signal.SIGXCPU,
        128 + signal.SIGKILL,
        -signal.SIGXCPU,
        -signal.SIGKILL,
    )
    cpu_limit = group_cpu or (killed and not memory_limit)
    return Result(
        rc, _tail(out), _tail(err), time.perf_counter() - t0, wall_timeout, cpu_limit, memory_limit
    )


def _kill(pid: int, group: cgroups.Group | None) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if group is not None:
        group.kill()


def _default_env(workdir: Path) -> dict[str, str]:
    # one thread per numeric library: their default (one per core) would use up the pids cap
    threads = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        **threads,
    }
