"""Control groups for the sandbox: one group per sandbox caps memory, processes and CPU time
for everything inside it together (rlimits only bind each process on its own).

cgroup v2 is used where this process's group can hand the memory and pids controllers to a
child; otherwise cgroup v1's `memory`, `pids` and `cpuacct` hierarchies where they are
mounted and writable (root, hybrid hosts). `probe()` says which, or why neither works; the
sandbox then falls back to per-process limits and says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_PREFIX = "agentrft-sandbox-"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) > 4 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's group per hierarchy: "" for v2, each controller name for v1."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


@dataclass
class Group:
    """One sandbox's group: create it, put the child in it (`join`, run in the child before
    exec), read its CPU time and OOM kills, kill everything in it and remove it."""

    version: str  # "v2" or "v1"
    dirs: dict[str, Path]  # v2: {"": dir}; v1: {"memory": dir, "pids": dir, "cpuacct": dir}

    def _file(self, controller: str, name: str) -> Path:
        return self.dirs["" if self.version == "v2" else controller] / name

    def join(self) -> None:
        pid = str(os.getpid())
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(pid)

    def cpu_seconds(self) -> float:
        try:
            if self.version == "v2":
                for line in self._file("cpu", "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int(self._file("cpuacct", "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def oom_killed(self) -> bool:
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in self._file("memory", name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(out)

    def kill(self) -> None:
        kill_file = self._file("", "cgroup.kill") if self.version == "v2" else None
        if kill_file is not None and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        """Kill what is left and remove the group (a group must be empty to go)."""
        for _ in range(50):
            self.kill()
            try:
                for d in self.dirs.values():
                    if d.exists():
                        d.rmdir()
                return
            except OSError:
                time.sleep(0.02)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _set_limits(group: Group, memory_bytes: int, pids: int) -> None:
    if group.version == "v2":
        d = group.dirs[""]
        _write(d / "memory.max", str(memory_bytes))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(pids))
        return
    mem = group.dirs["memory"]
    _write(mem / "memory.limit_in_bytes", str(memory_bytes))
    if (mem / "memory.memsw.limit_in_bytes").exists():  # memory plus swap: no escape into swap
        with contextlib.suppress(OSError):
            _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
    _write(group.dirs["pids"] / "pids.max", str(pids))


def _v2_parent() -> Path | None:
    mount = next((m for m, kind, _ in _mounts() if kind == "cgroup2"), None)
    own = _own_paths().get("")
    if mount is None or own is None:
        return None
    base = Path(mount) / own.lstrip("/")
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    if not {"memory", "pids"} <= available:
        return None
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        # fails with EBUSY where `base` holds processes itself (the "no internal processes" rule)
        (base / "cgroup.subtree_control").write_text("+memory +pids")
    return base


def _v1_parents() -> dict[str, Path] | None:
    own = _own_paths()
    parents: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpuacct"):
        mount = next(
            (m for m, kind, opts in _mounts() if kind == "cgroup" and controller in opts), None
        )
        if mount is None or controller not in own:
            return None
        parents[controller] = Path(mount) / own[controller].lstrip("/")
    return parents


def create(memory_bytes: int, pids: int) -> Group:
    """A fresh group with these limits. Raises OSError where groups cannot be made here."""
    name = _PREFIX + uuid.uuid4().hex[:12]
    errors: list[str] = []
    v2 = None
    try:
        v2 = _v2_parent()
    except OSError as exc:
        errors.append(
            f"cgroup v2: cannot enable the memory and pids controllers ({exc.strerror or exc})"
        )
    if v2 is not None:
        group = Group("v2", {"": v2 / name})
    else:
        v1 = _v1_parents()
        if v1 is None:
            raise OSError(
                errors[0]
                if errors
                else "no cgroup v2 with the memory and pids controllers, and no cgroup v1 memory/pids/cpuacct hierarchy"
            )
        group = Group("v1", {c: p / name for c, p in v1.items()})
    try:
        for d in group.dirs.values():
            d.mkdir()
        _set_limits(group, memory_bytes, pids)
    except OSError:
        group.remove()
        raise
    return group
