"""`agentrft eval | preflight | compare | sample | report`: what a user does with a model
around training (baseline, learnability check, before/after, best-of-N, the HTML page)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrft.errors import AgentRFTError


def _out_dir(out: str | None, kind: str, base: str) -> Path:
    path = Path(out) if out else Path(base) / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _items(job: Any, data: str | None, rows: int | None, split: str) -> list[Any]:
    """The rows to run: --data FILE, else the job's validation (or training) file. Both of
    the job's files are validated first, so a bad line fails before any work."""
    from agentrft.data import load_dataset

    train = load_dataset(job.training_path)
    val = load_dataset(job.validation_path) if job.validation_path else None
    if data:
        items = load_dataset(data)
    elif split == "validation":
        items = val if val is not None else train
    else:
        items = train
    return items[:rows] if rows else items


def run_graded(job: Any, items: Sequence[Any], k: int, model: str | None, temperature: float | None, seed: int | None = None, label: str = "rollouts") -> list[Any]:
    """K graded rollouts per row with `model`: the job's model (`base`), a run directory or
    model path, or an OpenAI-compatible endpoint URL (evaluated, not trainable)."""
    from agentrft.cli import job_environment
    from agentrft.console import progress_bar
    from agentrft.evaluate.eval import rollout_and_grade
    from agentrft.graders import build_grader, tool_call_limit

    grader = build_grader(job.rl.grader, judge=job.agentrft.judge)
    ext = job.agentrft
    with job_environment(job) as env_url, progress_bar(label, len(items) * k) as advance:
        if model and model.startswith(("http://", "https://")):
            from agentrft.evaluate.endpoint import rollout_and_grade_endpoint

            return asyncio.run(rollout_and_grade_endpoint(job, items, k, model, grader, env_url, temperature, advance))
        from agentrft.policy.load import load_policy
        from agentrft.rollout.batching import BatchedSampler
        from agentrft.rollout.group import sampling_params, settings_from_job

        policy = load_policy(job.model if model in (None, "base") else model, base=job.model, device=ext.device, dtype=ext.dtype)
        settings = settings_from_job(job, policy, env_url)
        budget = tool_call_limit(grader)
        if budget is not None and (settings.max_tool_calls is None or budget < settings.max_tool_calls):
            import dataclasses

            settings = dataclasses.replace(settings, max_tool_calls=budget)
        params = sampling_params(job, seed=job.seed if seed is None else seed, temperature=temperature)
        sampler = BatchedSampler(policy, params, max_batch=ext.sampling.max_batch)
        groups, _ = asyncio.run(rollout_and_grade(items, k, settings, sampler, grader, env_url, advance))
        return groups


def cmd_eval(args: argparse.Namespace) -> int:
    from agentrft.console import console, summary_table
    from agentrft.evaluate.eval import eval_results, graded_records
    from agentrft.job import load_job
    from agentrft.rollout.records import finite, write_jsonl

    job = load_job(args.job)
    items = _items(job, args.data, args.rows, "validation")
    out = _out_dir(args.out, "eval", job.agentrft.output_dir)
    model = args.model or "base"
    console.print(f"[bold]agentrft eval[/] {args.job}: {len(items)} rows x {args.k} samples, model {model}")
    t0 = time.perf_counter()
    groups = run_graded(job, items, args.k, model, args.temperature, label="eval")
    res = eval_results(groups, args.threshold)
    res.update({"model": model, "job": str(args.job), "k": args.k, "rows": len(items), "wall_s": time.perf_counter() - t0})
    (out / "results.json").write_text(json.dumps(finite(res), indent=2))
    write_jsonl(out / "rollouts.jsonl", graded_records(groups))
    console.print(summary_table(res, title=f"eval: {model}"))
    console.print(f"wrote {out / 'results.json'} and rollouts.jsonl")
    return 0


def add_commands(sub: Any) -> None:
    e = sub.add_parser("eval", help="baseline or evaluate a model: reward, tool calls, tokens, latency")
    e.add_argument("job")
    e.add_argument("--model", default=None, help="base (default) | RUN_DIR | model path | http(s) URL of an OpenAI-compatible endpoint")
    e.add_argument("--data", default=None, help="a JSONL file (default: the job's validation file)")
    e.add_argument("-k", type=int, default=1, help="samples per row (default 1)")
    e.add_argument("--rows", type=int, default=None, help="only the first N rows")
    e.add_argument("--threshold", type=float, default=1.0, help="reward counted as a pass (default 1.0)")
    e.add_argument("--temperature", type=float, default=None, help="default: the job's sampling temperature")
    e.add_argument("--out", default=None, help="output directory (default runs/eval-TIMESTAMP)")
    e.set_defaults(func=cmd_eval)


def _must(cond: bool, msg: str) -> None:
    if not cond:
        raise AgentRFTError(msg)
