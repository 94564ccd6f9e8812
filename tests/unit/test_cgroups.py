"""cgroups.py against a fake cgroup v2 tree (this host may only have v1, and the real
hierarchy is not ours to change in a unit test): where the group goes, the limits it
writes, and how CPU time and OOM kills are read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrft import cgroups


@pytest.fixture
def v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = tmp_path / "sys" / "my.scope"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("memory pids\n")
    monkeypatch.setattr(cgroups, "_mounts", lambda: [(str(tmp_path / "sys"), "cgroup2", {"rw"})])
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"": "/my.scope"})
    return base


def test_v2_group_is_made_under_our_own_with_its_limits(
    v2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_mkdir = Path.mkdir

    def mkdir(
        self: Path, *a: object, **kw: object
    ) -> None:  # a real cgroupfs creates these files itself
        real_mkdir(self)
        for name in (
            "memory.max",
            "memory.swap.max",
            "pids.max",
            "cgroup.procs",
            "cpu.stat",
            "memory.events",
        ):
            (self / name).write_text("")

    monkeypatch.setattr(Path, "mkdir", mkdir)
    group = cgroups.create(300 << 20, 16)
    (d,) = group.dirs.values()
    assert group.version == "v2" and d.parent == v2 and d.name.startswith("agentrft-sandbox-")
    assert (d / "memory.max").read_text() == str(300 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "16"
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert group.cpu_seconds() == 2.5
    assert group.oom_killed()
    for f in d.iterdir():
        f.unlink()
    group.remove()
    assert not d.exists()


def test_no_usable_controllers_is_an_oserror_with_the_reason(
    v2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (v2 / "cgroup.controllers").write_text("cpu io\n")
    monkeypatch.setattr(cgroups, "_v1_parents", lambda: None)
    with pytest.raises(OSError, match="no cgroup v2 with the memory and pids controllers"):
        cgroups.create(64 << 20, 8)
