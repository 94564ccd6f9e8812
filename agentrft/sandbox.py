"""Run untrusted code inside bubblewrap: python graders now, model-triggered commands later.

    bwrap --ro-bind / / --tmpfs /tmp --dev /dev --proc /proc --unshare-all --die-with-parent
          --new-session --bind WORKDIR WORKDIR --chdir WORKDIR -- ARGV...

gives a read-only root, a private /tmp, no network (its own empty network namespace) and
one writable directory. rlimits bound CPU time (RLIMIT_CPU), address space (RLIMIT_AS) and
file size (RLIMIT_FSIZE); a wall-clock timeout kills the whole process group. Where bwrap
is missing or cannot create namespaces, `SandboxUnavailable` is raised with the fix:
untrusted code never runs unisolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrft.errors import SandboxUnavailable

INSTALL_HINT = "apt-get install bubblewrap   (or `make sandbox`)"
_KEEP_BYTES = 8192  # of stdout/stderr, from the end


@dataclass(frozen=True)
class Limits:
    """Defaults follow OpenAI's python graders: 2 minutes, 2 GB of memory, 1 GB of disk."""

    cpu_s: int = 120
    wall_s: float = 300.0  # above cpu_s: concurrent sandboxes share the cores
    memory_mb: int = 2048
    file_mb: int = 1024


@dataclass(frozen=True)
class Result:
    returncode: int | None  # None: killed at the wall-clock limit
    stdout: str  # the last 8 KiB
    stderr: str
    wall_s: float
    wall_timeout: bool
    cpu_limit: bool  # killed by RLIMIT_CPU (SIGXCPU, then SIGKILL)

    @property
    def timed_out(self) -> bool:
        return self.wall_timeout or self.cpu_limit


def _visible_under_tmp(argv: Sequence[str]) -> list[str]:
    """Directories under /tmp that the private /tmp would hide but the program needs: this
    interpreter's installation (a virtualenv in a checkout under /tmp) and, for a program
    given by path, its installation prefix (bin/..). They are bound back read-only."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    if argv and os.path.isabs(argv[0]):
        candidates.add(str(Path(argv[0]).parent.parent))
        candidates.add(os.path.dirname(os.path.realpath(argv[0])))
    tmp = Path("/tmp")
    found = sorted(c for c in candidates if tmp in Path(c).parents)
    return [c for c in found if not any(Path(o) in Path(c).parents for o in found)]  # outermost only


def bwrap_argv(workdir: Path, argv: Sequence[str]) -> list[str]:
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(f"untrusted code runs only inside bubblewrap, which is not installed. Install it:\n  {INSTALL_HINT}")
    w = str(workdir)
    keep = [arg for d in _visible_under_tmp(argv) for arg in ("--ro-bind", d, d)]
    return [
        exe, "--ro-bind", "/", "/", "--tmpfs", "/tmp", *keep, "--dev", "/dev", "--proc", "/proc",
        "--unshare-all", "--die-with-parent", "--new-session",
        "--bind", w, w, "--chdir", w, "--", *argv,
    ]


def _set_limits(limits: Limits) -> None:
    """In the child, before exec: the limits bind bwrap and everything it starts."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    mem = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    size = limits.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """None when bwrap can build a sandbox here, else why not."""
    try:
        argv = bwrap_argv(Path("/"), ["true"])
    except SandboxUnavailable as exc:
        return str(exc)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return (f"bubblewrap is installed but cannot create a sandbox here: {proc.stderr.strip()[:300]}. "
                "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root.")
    return None


def ensure_available() -> None:
    """Raise SandboxUnavailable (with the fix) unless a sandbox can be built."""
    why = _probe()
    if why is not None:
        raise SandboxUnavailable(why)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _KEEP_BYTES))
        return fh.read().decode("utf-8", "replace")


async def run_sandboxed(argv: Sequence[str], workdir: Path, limits: Limits, env: dict[str, str] | None = None) -> Result:
    """Run `argv` in a sandbox whose only writable directory is `workdir`."""
    ensure_available()
    cmd = bwrap_argv(workdir, argv)
    out, err = workdir / ".stdout", workdir / ".stderr"
    t0 = time.perf_counter()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True,
            env=env if env is not None else {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"},
            preexec_fn=functools.partial(_set_limits, limits),
        )
        wall_timeout = False
        try:
            rc: int | None = await asyncio.wait_for(proc.wait(), limits.wall_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            rc, wall_timeout = None, True
    # bwrap reports a child killed by signal S as 128 + S
    cpu_limit = rc is not None and rc in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGXCPU, -signal.SIGKILL)
    return Result(rc, _tail(out), _tail(err), time.perf_counter() - t0, wall_timeout, cpu_limit)

