"""Training across two hosts on Ray, for real: two network namespaces joined by a veth pair
give two addresses on this machine, with a Ray node in each (the head in one). `agentrft
train --ray` runs in the first; the quickstart job trains two steps with two engine actors
and two rollout workers spread over both hosts, each worker with its own environment server
on its own host's loopback. One engine actor is SIGKILLed after the first step, as the second rolls out: its requests
are sent again to the other, so no rollout is lost or scored 0, and the loss is counted.

The test stops its Ray nodes (by their process groups, then any process left that names its
own temporary directory) and removes its namespaces."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.needs import skip_without

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Host:
    ns: str
    ip: str

    def run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, *cmd], **kw)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    tag = secrets.token_hex(3)
    net = f"10.{random.randint(100, 250)}.{random.randint(0, 250)}"
    a, b = Host(f"arft-a-{tag}", f"{net}.1"), Host(f"arft-b-{tag}", f"{net}.2")
    made = []
    try:
        for h in (a, b):
            ip("netns", "add", h.ns)
            made.append(h.ns)
        ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        for h, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            ip("link", "set", dev, "netns", h.ns)
            ip("-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", dev)
            ip("-n", h.ns, "link", "set", dev, "up")
            ip("-n", h.ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _ours(marker: str) -> list[int]:
    """Processes whose command line names `marker` (this test's Ray temp dir)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return pids


@contextlib.contextmanager
def ray_node(host: Host, temp: str, log: Path, head: str | None = None) -> Iterator[None]:
    cmd = [
        str(BIN / "ray"),
        "start",
        "--block",
        "--node-ip-address",
        host.ip,
        "--num-cpus",
        "2",
        "--disable-usage-stats",
        "--temp-dir",
        temp,
    ]
    cmd += (
        ["--address", head] if head else ["--head", "--port", "6379", "--include-dashboard=false"]
    )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_for_nodes(host: Host, address: str, count: int, timeout: float = 120) -> None:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        r = host.run(sys.executable, "-c", probe, address, capture_output=True, text=True)
        last = r.stdout.strip() or r.stderr[-500:]
        if r.returncode == 0 and last.isdigit() and int(last) >= count:
            return
        time.sleep(2)
    raise AssertionError(f"the Ray cluster did not reach {count} nodes: {last}")


def quickstart_job(dst: Path) -> Path:
    shutil.copytree(QUICKSTART, dst)
    job = yaml.safe_load((dst / "job.yaml").read_text())
    job["validation_file"] = None
    job["method"]["reinforcement"]["hyperparameters"].update({"batch_size": 4, "n_epochs": 2})
    job["agentrft"].update(
        {
            "group_size": 4,
            "dtype": "fp32",
            "engine": "local",
            "train": {"max_steps": 2},
            "ray": {"engines": 2, "rollout_workers": 2},
        }
    )
    (dst / "job.yaml").write_text(yaml.safe_dump(job))
    return dst / "job.yaml"


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def test_two_hosts_train_two_steps_and_an_engine_actor_dies_mid_run(tmp_path, monkeypatch):
    skip_without("netns")
    # Ray's token authentication, as a real cluster has it: every node and driver shares it
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    temp = tempfile.mkdtemp(prefix="arft-ray-", dir="/tmp")  # short: Ray's socket paths
    logs = tmp_path / "logs"
    logs.mkdir()
    job = quickstart_job(tmp_path / "job")
    run = tmp_path / "run"
    try:
        with two_hosts() as (a, b):
            address = f"{a.ip}:6379"
            with (
                ray_node(a, temp, logs / "head.log"),
                ray_node(b, temp, logs / "node.log", address),
            ):
                wait_for_nodes(a, address, 2)
                with open(logs / "train.log", "wb") as out:
                    train = subprocess.Popen(
                        [
                            "ip", "netns", "exec", a.ns,
                            str(BIN / "agentrft"), "train", str(job),
                            "--ray", address, "--out", str(run),
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )  # fmt: skip
                try:
                    killed = None
                    deadline = time.monotonic() + 540
                    while train.poll() is None and time.monotonic() < deadline:
                        if killed is None and any(m.get("step") == 1 for m in metrics(run)):
                            layout = json.loads((run / "cluster.json").read_text())
                            victim = next(e for e in layout["engines"] if e["node_ip"] == b.ip)
                            os.kill(victim["pid"], signal.SIGKILL)
                            killed = victim
                        time.sleep(0.5)
                    rc = train.wait(timeout=30)
                finally:
                    if train.poll() is None:
                        os.killpg(train.pid, signal.SIGKILL)
                        train.wait()
        log = (logs / "train.log").read_text(errors="replace")
        assert rc == 0, log[-4000:]
        layout = json.loads((run / "cluster.json").read_text())
        assert {e["node_ip"] for e in layout["engines"]} == {a.ip, b.ip}
        assert {w["node_ip"] for w in layout["rollout_workers"]} == {a.ip, b.ip}
        assert layout["trainer"]["node_ip"] == a.ip
        assert killed is not None, "step 1 never finished before the run ended"
        steps = [m for m in metrics(run) if m.get("step", 0) > 0]
        assert [m["step"] for m in steps] == [1, 2]
        assert steps[-1]["engine/actors_lost"] == 1 and steps[-1]["engine/actors"] == 1
        # the dead actor's requests went to the other one: nothing discarded, nothing lost
        assert sum(m["engine/retried_requests"] for m in steps) >= 1
        assert all(m["rollouts/discarded"] == 0 for m in steps)
        assert all(m["reward/n"] == 16 for m in steps)
        assert all(m["engine/wrong_adapter"] == 0 for m in steps)
        assert [m["sampled_with"] for m in steps] == ["base", "step-1"]
        assert (run / "final" / "merged" / "config.json").is_file()
    finally:
        for pid in _ours(temp):  # anything of this test's cluster still running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
