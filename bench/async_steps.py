"""Synchronous against async steps on the same job, side by side in one run, where the
user's tool has latency: the quickstart job (135M model, local engine) with its
`lookup_country` tool answering after 200-500 ms, from a real HTTP environment server.

    .venv/bin/python bench/async_steps.py [--staleness 0 1] [--seeds 1 2 3] [--steps 6]
        [--latency-ms 200 500] [--json out.json]

For each seed, the runs alternate between the `--staleness` values (0 is the synchronous
loop), so a machine's slow phases hit all of them. Reported per max_staleness, from each
run's own metrics (`metrics.jsonl`):
- step time: the mean of `time/step_s` (one update to the next), the first step left out
  (it has nothing to overlap with);
- trainer idle share: the share of a step the update waits for rollouts and grades
  (`time/trainer_idle_share`, synchronous: sampling + grading over the step);
- reward per wall-clock minute: the rollouts' rewards summed over the run, over its steps'
  minutes; and the mean reward per step, to show the async steps learn no worse.

Each rollout's tool latency is fixed by its trace and arguments (a hash), not drawn at call
time, so both modes wait the same on the same calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from engines import cpu_flags, cpu_name  # noqa: E402

SLOW_ENV = '''
"""The quickstart's tool, answering after a latency fixed by the call (see the bench)."""
import asyncio, os, zlib

from agentrft.tools.envkit import ToolInputError, ToolServer
from env import COUNTRIES

LOW, HIGH = (float(x) / 1000 for x in os.environ["BENCH_TOOL_LATENCY_MS"].split(","))
env = ToolServer("quickstart-slow")


@env.tool(
    description="Look up the capital, currency and continent of a country.",
    parameters={
        "type": "object",
        "properties": {"country": {"type": "string", "description": "Country name, e.g. France"}},
        "required": ["country"],
    },
)
async def lookup_country(ctx, country: str) -> str:
    h = zlib.crc32(f"{ctx.trace_id}:{country}".encode()) % 1000 / 1000
    await asyncio.sleep(LOW + (HIGH - LOW) * h)
    facts = COUNTRIES.get(country.strip().lower())
    if facts is None:
        raise ToolInputError(f"unknown country {country!r}")
    return ", ".join(f"{k}: {v}" for k, v in facts.items())


app = env.app
'''


def run_once(tmp: Path, seed: int, staleness: int, steps: int) -> dict[str, Any]:
    from agentrft.job import load_job
    from agentrft.train.loop import train

    src = ROOT / "examples" / "quickstart"
    work = tmp / f"s{seed}-k{staleness}"
    work.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (work / f.name).write_bytes(f.read_bytes())
    (work / "slow_env.py").write_text(SLOW_ENV)
    job = yaml.safe_load((src / "job.yaml").read_text())
    job["seed"] = seed
    job["validation_file"] = None
    job["method"]["reinforcement"]["hyperparameters"]["n_epochs"] = steps  # 8 rows, batch 4
    job["agentrft"]["environment"] = {"app": "slow_env:app"}
    job["agentrft"]["engine"] = "local"
    job["agentrft"]["train"] = {"max_steps": steps, "max_staleness": staleness}
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    run = work / "run"
    train(load_job(work / "job.yaml"), run)
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln]
    steps_m = [m for m in lines if m["step"] > 0]
    later = steps_m[1:]
    minutes = sum(m["time/step_s"] for m in steps_m) / 60
    rewards = [m["reward/mean"] for m in steps_m]
    rewarded = sum(m["reward/mean"] * m["reward/n"] for m in steps_m)
    idle = [
        m.get(
            "time/trainer_idle_share",
            m["time/trainer_idle_s"] / m["time/step_s"] if "time/trainer_idle_s" in m else None,
        )
        for m in later
    ]
    return {
        "seed": seed,
        "max_staleness": staleness,
        "step_s": statistics.fmean(m["time/step_s"] for m in later),
        "trainer_idle_share": statistics.fmean(x for x in idle if x is not None),
        "reward_per_min": rewarded / minutes,
        "mean_reward": statistics.fmean(rewards),
        "tool_latency_p50_s": statistics.fmean(m["rollouts/tool_latency_s/p50"] for m in later),
        "off_policy_rollouts": sum(m.get("async/off_policy_rollouts", 0.0) for m in steps_m),
        "dropped_stale": sum(m.get("async/dropped_stale", 0.0) for m in steps_m),
    }


def summary(rows: list[dict[str, Any]], staleness: list[int]) -> list[dict[str, Any]]:
    out = []
    base = [r for r in rows if r["max_staleness"] == staleness[0]]
    for k in staleness:
        mine = [r for r in rows if r["max_staleness"] == k]
        step = statistics.fmean(r["step_s"] for r in mine)
        ratios = [
            b["step_s"] / r["step_s"]
            for b, r in zip(
                sorted(base, key=lambda r: r["seed"]),
                sorted(mine, key=lambda r: r["seed"]),
                strict=True,
            )
        ]
        out.append(
            {
                "max_staleness": k,
                "runs": len(mine),
                "step_s": round(step, 2),
                f"speedup_vs_{staleness[0]}": round(statistics.fmean(ratios), 2),
                "speedup_min_max": [round(min(ratios), 2), round(max(ratios), 2)],
                "trainer_idle_share": round(
                    statistics.fmean(r["trainer_idle_share"] for r in mine), 3
                ),
                "reward_per_min": round(statistics.fmean(r["reward_per_min"] for r in mine), 2),
                "mean_reward": round(statistics.fmean(r["mean_reward"] for r in mine), 3),
                "mean_reward_by_seed": [
                    round(r["mean_reward"], 3) for r in sorted(mine, key=lambda r: r["seed"])
                ],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--latency-ms", type=int, nargs=2, default=[200, 500])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import os

    os.environ["BENCH_TOOL_LATENCY_MS"] = ",".join(map(str, args.latency_ms))
    print(f"cpu: {cpu_name()} ({os.cpu_count()} cores; {cpu_flags()})", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for k in args.staleness:
                row = run_once(Path(tmp), seed, k, args.steps)
                print(json.dumps(row), flush=True)
                rows.append(row)
    table = summary(rows, args.staleness)
    for line in table:
        print(json.dumps(line), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "cpu": cpu_name(),
                    "flags": cpu_flags(),
                    "args": vars(args),
                    "runs": rows,
                    "summary": table,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
