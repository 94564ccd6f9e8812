"""`make demo`: the file-selection recipe end to end, on this repository's own git history.

    data -> baseline eval -> pre-flight -> train -> eval of the trained model -> compare + report

The dataset is built from the history up to PINNED_REV, so every clone builds the same rows
(later commits do not shift the numbers). Everything lands in one folder (default runs/demo).
Run it through `make demo` or `agentrft demo [--steps N] [--seed S] [--out DIR]`, and over
several seeds with `agentrft demo --seeds 1 2 3` (recipe interface: agentrft.recipes).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrft.console import console, show_messages, summary_table
from agentrft.data import load_dataset
from agentrft.data.from_git import build_dataset
from agentrft.errors import ConfigError
from agentrft.evaluate.commands import evaluate_model, preflight_job, print_compare, print_preflight
from agentrft.evaluate.estimators import paired_difference, row_means
from agentrft.evaluate.report import write_report
from agentrft.job import Job, load_job
from agentrft.rollout.records import read_jsonl
from agentrft.train.loop import train
from agentrft.train.observe import read_metrics

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PINNED_REV = "2fc09be9e65b91fff88eb8c40650deed8b9acf28"  # history up to this commit: every clone builds the same rows
VAL_FRACTION = 0.25  # the newest quarter of the kept commits: 16 held-out rows at PINNED_REV
EVAL_SAMPLES = 2  # rollouts per validation row, before and after
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 8


def demo_job(
    data: Path, out: Path, steps: int | None, seed: int | None, job_path: Path = HERE / "job.yaml"
) -> Job:
    """The recipe's job (or a variant of it, such as job_v6.yaml), reading the demo's data and
    writing under `out`."""
    job = load_job(job_path)
    train_cfg = (
        job.agentrft.train
        if steps is None
        else job.agentrft.train.model_copy(
            update={"max_steps": steps, "checkpoint_interval": steps}
        )
    )
    update: dict[str, Any] = {
        "training_file": str(data / "train.jsonl"),
        "validation_file": None,  # evaluated before and after, outside the loop
        "agentrft": job.agentrft.model_copy(update={"train": train_cfg, "output_dir": str(out)}),
    }
    if seed is not None:
        update["seed"] = seed
    return job.model_copy(update=update)  # paths still resolve against the job file's folder


def headline(res: dict[str, Any], formula: str) -> dict[str, float]:
    """The numbers the README reports for one evaluation: the reward (`formula` is the job's
    calculate_output), then each sub-grader's mean, then the tool use."""
    subs = res.get("sub_rewards", {})
    out = {
        f"reward ({formula})": res["reward"]["mean"],
        "mean file F1": subs.get("files", float("nan")),
    }
    out |= {
        f"sub-grader {name}": value
        for name, value in subs.items()
        if name != "files" and "." not in name
    }
    return out | {
        "tool calls p50": res["tool_calls"]["p50"],
        "tool calls p95": res["tool_calls"]["p95"],
        "turns per rollout": res["turns"]["mean"],
        "sampled tokens per rollout": res["sampled_tokens"]["mean"],
        "invalid tool calls": float(res["invalid_tool_calls"]),
    }


def calls_per_turn(records: list[dict[str, Any]]) -> float:
    """Tool calls per turn that made any (parallel calls in one reply count together)."""
    counts = [len(t.get("tool_calls") or []) for r in records for t in r.get("turns") or []]
    with_calls = [c for c in counts if c]
    return sum(with_calls) / len(with_calls) if with_calls else 0.0


def per_row_f1(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Exact file F1 per held-out row, before and after, and the paired difference."""
    a, b = row_means(before, "files"), row_means(after, "files")
    rows = sorted(set(a) & set(b))
    diff = paired_difference([b[r] - a[r] for r in rows])
    return {
        "rows": {str(r): {"before": a[r], "after": b[r]} for r in rows},
        "difference": {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": diff.n},
    }


def show_best_rollout(records: list[dict[str, Any]], label: str) -> None:
    """The highest-rewarded rollout that called a tool: the row's request onwards (the system
    prompt and the worked examples are left out)."""
    with_calls = [r for r in records if r.get("num_tool_calls") and r.get("reward") is not None]
    if not with_calls:
        console.print(f"({label}: no rollout called a tool)")
        return
    best = max(with_calls, key=lambda r: r["reward"])
    messages = best["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    expected = ", ".join(best["item"].get("files", []))
    show_messages(
        messages[start:],
        f"{label}: best rollout with a tool call  reward={best['reward']:.3f}  expected: {expected}",
        max_chars=600,
    )


def run(
    out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = (
        out.resolve()
    )  # the job resolves relative paths against the recipe's folder, not the caller's
    out.mkdir(parents=True, exist_ok=True)

    console.rule("1/6 data: this repository's history")
    report = build_dataset(REPO, out / "data", rev=PINNED_REV, val_fraction=VAL_FRACTION)
    for line in report.lines():
        console.print(line)
    if report.train < PREFLIGHT_ROWS or report.val < 2:
        raise ConfigError(
            f"{REPO}: too little git history for the demo ({report.train} train / {report.val} val rows); it needs a full clone, not a shallow one"
        )
    job = demo_job(
        out / "data", out, steps, seed, job_path.resolve() if job_path else HERE / "job.yaml"
    )
    train_items, val_items = (
        load_dataset(out / "data/train.jsonl"),
        load_dataset(out / "data/val.jsonl"),
    )

    console.rule(f"2/6 baseline: the base model on {len(val_items)} held-out rows x {EVAL_SAMPLES}")
    before = evaluate_model(
        job, val_items, EVAL_SAMPLES, "base", out / "baseline", label="baseline"
    )
    console.print(summary_table(before, title="baseline"))

    console.rule(f"3/6 pre-flight: {PREFLIGHT_ROWS} training rows x {PREFLIGHT_K}")
    rep = preflight_job(job, train_items[:PREFLIGHT_ROWS], PREFLIGHT_K, out / "preflight")
    print_preflight(rep)
    if rep["verdict"] in (
        "broken",
        "no_reward",
    ):  # the seed's order: fix the task before training on it
        raise ConfigError(
            f"pre-flight verdict {rep['verdict']!r}: training would learn nothing; see {out / 'preflight'} and the advice above"
        )

    console.rule("4/6 train")
    run_dir = train(job, out / "run")

    console.rule("5/6 the trained model on the same held-out rows")
    after = evaluate_model(
        job, val_items, EVAL_SAMPLES, str(run_dir), out / "trained", label="trained"
    )
    console.print(summary_table(after, title="trained"))

    console.rule("6/6 compare")
    print_compare(before, after, "base", "trained")
    formula = job.rl.grader.get("calculate_output", job.rl.grader["type"])
    a, b = headline(before, formula), headline(after, formula)
    base_records, trained_records = (
        read_jsonl(out / "baseline/rollouts.jsonl"),
        read_jsonl(out / "trained/rollouts.jsonl"),
    )
    a["tool calls per turn"], b["tool calls per turn"] = (
        calls_per_turn(base_records),
        calls_per_turn(trained_records),
    )
    paired = per_row_f1(base_records, trained_records)
    summary = {
        "before": a,
        "after": b,
        "preflight": {k: rep[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
        "job": str(job.source),
        "steps": len(read_metrics(run_dir)),
        "seed": job.seed,
        "rows": {"train": len(train_items), "val": len(val_items)},
        "per_row_file_f1": paired,
        "wall_s": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    page = write_report(
        out / "report.html",
        metrics=read_metrics(run_dir),
        before={"summary": before, "rollouts": base_records},
        after={"summary": after, "rollouts": trained_records},
        rollouts=trained_records,
        title="agentrft demo: file selection",
    )
    show_best_rollout(trained_records, "trained model, held-out row")
    width = max(map(len, a)) + 2
    console.print(f"\n{'held-out rows':<{width}}{'base':>10}{'trained':>10}")
    for k in a:
        console.print(f"{k:<{width}}{a[k]:>10.3f}{b[k]:>10.3f}")
    d = paired["difference"]
    console.print(
        f"\nexact file F1, trained - base, per held-out row: {d['mean']:+.3f} (95% interval {d['low']:+.3f} .. {d['high']:+.3f}, {d['n']} rows)"
    )
    console.print(f"\nreport: {page}\nall outputs: {out}   ({summary['wall_s'] / 60:.1f} min)")
    return summary


def run_seeds(
    out: Path, seeds: list[int], steps: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    """The whole demo once per seed (out/seed-N), then each seed's before/after and the mean
    gain in exact file F1 with a 95% interval over all per-row differences. A seed whose
    folder already holds a finished run is not run again, so seeds can run side by side
    (`agentrft demo --seed N --out DIR/seed-N`) and be summed up here."""
    per_seed = {}
    for seed in seeds:
        done = out / f"seed-{seed}" / "summary.json"
        if (
            done.is_file()
        ):  # a finished seed (say, run alone with --seed N --out DIR/seed-N) is kept
            per_seed[seed] = json.loads(done.read_text())
            console.print(
                f"seed {seed}: reusing the finished run in {done.parent} (delete it to run this seed again)"
            )
            continue
        console.rule(f"[bold]seed {seed} ({seeds.index(seed) + 1} of {len(seeds)})")
        per_seed[seed] = run(out / f"seed-{seed}", steps=steps, seed=seed, job_path=job_path)
    diffs = [
        r["after"] - r["before"]
        for s in per_seed.values()
        for r in s["per_row_file_f1"]["rows"].values()
    ]
    pooled = paired_difference(diffs)
    console.rule("all seeds: exact file F1 on the held-out rows")
    console.print(
        f"{'seed':>6}{'base':>10}{'trained':>10}{'gain':>10}   95% interval of the gain (per-row)"
    )
    for seed, s in per_seed.items():
        d = s["per_row_file_f1"]["difference"]
        f1a, f1b = s["before"]["mean file F1"], s["after"]["mean file F1"]
        console.print(
            f"{seed:>6}{f1a:>10.3f}{f1b:>10.3f}{f1b - f1a:>+10.3f}   {d['low']:+.3f} .. {d['high']:+.3f}"
        )
    mean_a = sum(s["before"]["mean file F1"] for s in per_seed.values()) / len(per_seed)
    mean_b = sum(s["after"]["mean file F1"] for s in per_seed.values()) / len(per_seed)
    console.print(
        f"{'mean':>6}{mean_a:>10.3f}{mean_b:>10.3f}{mean_b - mean_a:>+10.3f}   {pooled.low:+.3f} .. {pooled.high:+.3f}  ({pooled.n} row differences)"
    )
    result = {
        "seeds": {str(k): v for k, v in per_seed.items()},
        "before": mean_a,
        "after": mean_b,
        "gain": {"mean": pooled.mean, "low": pooled.low, "high": pooled.high, "n": pooled.n},
    }
    (out / "seeds.json").write_text(json.dumps(result, indent=2))
    console.print(f"wrote {out / 'seeds.json'}")
    return result
