"""Mixed load on `agentrft serve-model` (the real 135M) and on the service (`agentrft serve`,
its /v1/chat/completions on the base model and its API), each started as a user starts it.

    .venv/bin/python bench/serve_load.py [--seconds 180] [--clients 32] [--target both]

`--clients` clients at once, for `--seconds`, each in a loop:
- a third of them hang up early: they send a large request (streamed or not, in turn) and
  close the connection after 0.2-1.5 s;
- the others send small chat requests, streamed (odd clients) or not (even ones), with a
  bad request first and every fifth one after (malformed JSON, a missing or wrong-typed `messages`, an
  unknown model, a negative `max_tokens`, `tool_choice` without tools; on the service also
  a wrong API key) and, on the service, API reads (models, jobs, files) between them.

Reported per server: p50/p99 latency of the good requests (streamed and not), the outcomes
by kind, RSS and threads after warm-up and after the load (once its requests are done),
and the server's CPU use in the 3 s after the load (hung-up requests must stop using it). RSS
and threads are also sampled each second under load: "warm" is the sample after a third of
the load, when the server has seen its batch sizes and its thread pools have grown to what
the load needs; growth past it is what a leak would show.
A bad request must get a 4xx; a good one a 2xx or a 429 (the queued-token cap, a clean
refusal); nothing may get a 5xx or lose its connection unless its own client hung up.

`tests/integration/test_serve_load.py` runs the same for a few seconds per server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentrft.policy.precision import read_cpuinfo
from agentrft.tools.envkit import free_port

MODEL = "smollm2-135m-instruct"
KEY = "sk-load"
PROMPTS = ["Tell me a fact about cats.", "Why is the sky blue?", "Name three rivers.", "Hi!"]
LONG = "Write a very long story about a dragon who learns to cook."
BAD = {  # name -> a body that must get a 4xx (bytes: sent as they are)
    "malformed_json": b'{"model": "smollm2-135m-instruct", "messages": [',
    "no_messages": {"model": MODEL},
    "messages_not_a_list": {"model": MODEL, "messages": 5},
    "unknown_model": {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
    "negative_max_tokens": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": -1,
    },
    "tool_choice_without_tools": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "tool_choice": "required",
    },
}
SERVICE_READS = ["/v1/models", "/v1/fine_tuning/jobs", "/v1/files"]


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return dict(line.split(":", 1) for line in fh if ":" in line)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """`agentrft serve-model base` or `agentrft serve` in its own process, on a free port."""

    def __init__(self, target: str, data_dir: Path) -> None:
        self.target, self.port = target, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = (
            ["serve-model", "base"]
            if target == "serve-model"
            else ["serve", "--data-dir", str(data_dir)]
        )
        self.log = (data_dir.parent / f"{target}-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrft.cli", *args, "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AGENTRFT_API_KEYS": KEY, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{target} exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target} did not start in 300 s: see {self.log.name}")
            time.sleep(0.3)

    def rss_mb(self) -> float:
        return int(proc_status(self.proc.pid)["VmRSS"].split()[0]) / 1024

    def threads(self) -> int:
        return int(proc_status(self.proc.pid)["Threads"])

    def stop(self) -> float:
        """SIGTERM, and the seconds until the process exited (SIGKILL after 60 s)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return time.monotonic() - t0


@dataclass
class Load:
    """What came back, by kind, and the latencies of the good chat requests."""

    outcomes: Counter[str] = field(default_factory=Counter)
    latency_s: dict[str, list[float]] = field(default_factory=lambda: {"stream": [], "plain": []})
    problems: list[str] = field(default_factory=list)  # a 5xx, a lost connection, a bad 2xx

    def record(self, outcome: str, problem: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if problem is not None and len(self.problems) < 50:
            self.problems.append(problem)


def chat_body(client: int, n: int, stream: bool, long: bool = False) -> dict[str, Any]:
    prompt = LONG if long else PROMPTS[(client + n) % len(PROMPTS)]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 256 if long else 16,
        "temperature": 1.0,
        "seed": client * 1000 + n,
        "stream": stream,
    }


async def send_chat(h: httpx.AsyncClient, body: dict[str, Any]) -> int:
    """POST a chat request and read the whole reply; its status code."""
    if not body.get("stream"):
        return (await h.post("/v1/chat/completions", json=body)).status_code
    async with h.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code
        done = False
        async for line in r.aiter_lines():
            done = done or line.strip() == "data: [DONE]"
        return 200 if done else 599  # a stream cut before [DONE]


def classify(status: int, good: bool) -> tuple[str, str | None]:
    if status == 429:
        return "refused 429", None
    if status >= 500:
        return f"server error {status}", f"{status} for a {'good' if good else 'bad'} request"
    if good:
        return ("ok", None) if status < 300 else (f"good got {status}", f"{status} for a good one")
    return (
        (f"bad refused {status // 100}xx", None)
        if 400 <= status < 500
        else ("bad accepted", f"{status} for a bad request")
    )


async def client_loop(
    i: int, url: str, target: str, until: float, load: Load, rng: random.Random
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as h:
        n = 0
        while time.monotonic() < until:
            n += 1
            try:
                if i % 3 == 2:  # hangs up early
                    body = chat_body(i, n, stream=n % 2 == 0, long=True)
                    try:
                        await asyncio.wait_for(send_chat(h, body), rng.uniform(0.2, 1.5))
                        load.record("hang-up finished first")
                    except TimeoutError:
                        load.record("hung up")
                    continue
                if n % 5 == 1:  # a bad request, the first of every five
                    name = list(BAD)[(i + n // 5) % len(BAD)]
                    bad = BAD[name]
                    if target == "service" and n % 10 == 6:
                        r = await h.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"})
                        status = r.status_code
                    elif isinstance(bad, bytes):
                        r = await h.post(
                            "/v1/chat/completions",
                            content=bad,
                            headers={"content-type": "application/json"},
                        )
                        status = r.status_code
                    else:
                        status = await send_chat(h, bad)
                    load.record(*classify(status, good=False))
                    continue
                if target == "service" and n % 5 == 3:  # an API read between the chats
                    r = await h.get(SERVICE_READS[n % len(SERVICE_READS)])
                    load.record(*classify(r.status_code, good=True))
                    continue
                stream = i % 2 == 1
                t0 = time.perf_counter()
                status = await send_chat(h, chat_body(i, n, stream))
                outcome, problem = classify(status, good=True)
                if outcome == "ok":
                    load.latency_s["stream" if stream else "plain"].append(time.perf_counter() - t0)
                load.record(outcome, problem)
            except httpx.TransportError as exc:
                load.record(f"lost connection ({type(exc).__name__})", repr(exc))
                await asyncio.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def run_load(target: str, seconds: float, clients: int, work: Path) -> dict[str, Any]:
    """Start `target`, warm it up, run the load, measure, stop it; the numbers."""
    server = ServerProcess(target, work / target)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}) as h:
            for stream in (False, True):  # loads the model (the service loads it on first use)
                r = h.post("/v1/chat/completions", json=chat_body(0, 0, stream), timeout=300)
                r.raise_for_status()
        rss0, threads0 = server.rss_mb(), server.threads()
        load = Load()
        rng = random.Random(0)

        rss: list[float] = []  # once a second under load
        threads: list[int] = []

        async def sample(until: float) -> None:
            while time.monotonic() < until:
                rss.append(server.rss_mb())
                threads.append(server.threads())
                await asyncio.sleep(1.0)

        async def all_clients() -> None:
            until = time.monotonic() + seconds
            await asyncio.gather(
                sample(until),
                *(client_loop(i, server.url, target, until, load, rng) for i in range(clients)),
            )

        t0 = time.monotonic()
        asyncio.run(all_clients())
        wall = time.monotonic() - t0
        time.sleep(1.0)  # the last hung-up requests are cancelled within a second
        busy0 = cpu_seconds(server.proc.pid)
        time.sleep(3.0)
        idle_cpu = cpu_seconds(server.proc.pid) - busy0
        rss1, threads1 = server.rss_mb(), server.threads()
        after = httpx.post(
            server.url + "/v1/chat/completions",
            json=chat_body(0, 1, False),
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=120,
        ).status_code
    finally:
        exit_s = server.stop()
    return {
        "target": target,
        "clients": clients,
        "seconds": round(wall, 1),
        "requests": sum(load.outcomes.values()),
        "outcomes": dict(sorted(load.outcomes.items())),
        "problems": load.problems,
        "latency_s": {
            k: {"n": len(v), "p50": round(pct(v, 50), 3), "p99": round(pct(v, 99), 3)}
            for k, v in load.latency_s.items()
        },
        # warm: after the first third of the load, once every batch size has been seen
        "rss_mb": {
            "start": round(rss0),
            "warm": round(rss[len(rss) // 3]),
            "peak": round(max(rss)),
            "end": round(rss1),
        },
        "rss_mb_each_s": [round(x) for x in rss],
        "threads": {
            "start": threads0,
            "warm": threads[len(threads) // 3],
            "peak": max(threads),
            "end": threads1,
        },
        "cpu_s_in_3s_after": round(idle_cpu, 2),
        "status_after": after,
        "sigterm_to_exit_s": round(exit_s, 1),
    }


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("requests (in s)", lambda r: f"{r['requests']} ({r['seconds']:g} s)"),
        (
            "p50 / p99 plain (s)",
            lambda r: "{p50} / {p99} (n={n})".format(**r["latency_s"]["plain"]),
        ),
        (
            "p50 / p99 streamed (s)",
            lambda r: "{p50} / {p99} (n={n})".format(**r["latency_s"]["stream"]),
        ),
        ("outcomes", lambda r: ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items())),
        ("5xx, lost connections, bad accepted", lambda r: str(len(r["problems"]))),
        (
            "RSS start, warm, peak, end (MB)",
            lambda r: "{start}, {warm}, {peak}, {end}".format(**r["rss_mb"]),
        ),
        (
            "threads start, warm, peak, end",
            lambda r: "{start}, {warm}, {peak}, {end}".format(**r["threads"]),
        ),
        ("CPU s in the 3 s after", lambda r: f"{r['cpu_s_in_3s_after']:g}"),
        ("SIGTERM to exit (s)", lambda r: f"{r['sigterm_to_exit_s']:g}"),
    ]
    head = "| | " + " | ".join(r["target"] for r in results) + " |"
    sep = "| --- |" + " --- |" * len(results)
    body = [f"| {name} | " + " | ".join(f(r) for r in results) + " |" for name, f in rows]
    return "\n".join([head, sep, *body])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--target", choices=["serve-model", "service", "both"], default="both")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()
    targets = ["serve-model", "service"] if args.target == "both" else [args.target]
    name, flags = read_cpuinfo()
    bf16 = sorted((flags or frozenset()) & {"avx512_bf16", "amx_bf16"})
    cpu = f"{name or 'unknown CPU'} ({', '.join(bf16) or 'no bf16 units'})"
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {args.clients} clients, {args.seconds:g} s each")
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrft-load-") as tmp:
        for target in targets:
            (Path(tmp) / target).mkdir()
            results.append(run_load(target, args.seconds, args.clients, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "results": results}, indent=1))


if __name__ == "__main__":
    main()
