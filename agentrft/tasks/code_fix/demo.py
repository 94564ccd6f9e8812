"""`agentrft demo code_fix`: the code-fix recipe end to end, on this repository's own code.

    data -> the task as is: baseline + pre-flight -> (no signal) the easier variant: baseline
    + pre-flight -> train only where the pre-flight found signal -> trained eval -> compare

Bugs are injected into small, pure modules of this repository at PINNED_REV (read with `git
archive`, so every clone builds the same rows) and kept where their own unit tests catch them.
The seed's order is kept: no training on a task whose pre-flight says it cannot teach. The
task as is (the failing test only) is measured first; the easier variant (the buggy function
shown, the edit call prefilled on the buggy line: it gives the location away) second; the one
with signal is trained. Run it through `agentrft demo code_fix [--steps N] [--seed S] [--out
DIR]`, and over several seeds with `--seeds 1 2 3`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrft.console import console, summary_table
from agentrft.data import load_dataset
from agentrft.errors import ConfigError
from agentrft.evaluate.commands import evaluate_model, preflight_job, print_compare, print_preflight
from agentrft.evaluate.estimators import paired_difference
from agentrft.evaluate.report import write_report
from agentrft.job import Job
from agentrft.rollout.records import read_jsonl
from agentrft.tasks import runner as recipes
from agentrft.tasks.code_fix.dataset import build_dataset, hinted
from agentrft.tools.envkit import free_port
from agentrft.train.loop import train
from agentrft.train.observe import read_metrics

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # the agentrft checkout
PINNED_REV = "fb285dde908efab8c8bc1ae25f97d1994d15474e"  # the code the bugs go into: every clone builds the same rows
INCLUDE = (  # small, pure modules whose unit tests run in seconds without the model
    "agentrft/graders/string_check.py",
    "agentrft/graders/file_f1.py",
    "agentrft/graders/multi.py",
    "agentrft/graders/template.py",
    "agentrft/evaluate/estimators.py",
)
MAX_PER_FILE = 6
EVAL_SAMPLES = 2  # rollouts per held-out row, before and after
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 4
NO_REWARD = "no_reward: this model never passes the gate"
VARIANTS = {  # name -> (hint level, job file, data folder: the one the job file reads)
    "task": ("none", "job.yaml", "data"),
    "easier": ("line", "job_easy.yaml", "data-easy"),
}


def build_data(out: Path) -> dict[str, Path]:
    """The rows once (the bugs and their test runs: out/data, the task as is), then the
    easier variant's prompt of the same bugs (out/data-easy)."""
    report = build_dataset(
        REPO, out / "data", rev=PINNED_REV, include=INCLUDE, max_per_file=MAX_PER_FILE
    )
    for line in report.lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if report.train < PREFLIGHT_ROWS or report.val < 2:
        raise ConfigError(
            f"{REPO}: too few bugs kept for the demo ({report.train} train / {report.val} validation rows)"
        )
    dirs = {"task": out / "data"}
    for split in ("train", "val"):
        rows = [json.loads(x) for x in (out / "data" / f"{split}.jsonl").read_text().splitlines()]
        (out / "data-easy").mkdir(parents=True, exist_ok=True)
        (out / "data-easy" / f"{split}.jsonl").write_text(
            "".join(json.dumps(hinted(r, "line"), ensure_ascii=False) + "\n" for r in rows)
        )
    dirs["easier"] = out / "data-easy"
    return dirs


def variant_job(
    name: str, data: Path, out: Path, steps: int | None, seed: int | None, job_path: Path | None
) -> Job:
    """The variant's job (`job_path` replaces the task's own) reading `data`, its environment
    and graders on a free port (so demos can run side by side)."""
    job_file = job_path.resolve() if job_path and name == "task" else HERE / VARIANTS[name][1]
    job = recipes.demo_job(HERE, data, out, steps, seed, job_file)
    port = free_port()
    grader = json.loads(json.dumps(job.rl.grader).replace("127.0.0.1:8741", f"127.0.0.1:{port}"))
    assert job.agentrft.environment is not None
    env = job.agentrft.environment.model_copy(update={"port": port})
    rl = job.rl.model_copy(update={"grader": grader})
    method = job.method.model_copy(update={"reinforcement": rl})
    return job.model_copy(
        update={"method": method, "agentrft": job.agentrft.model_copy(update={"environment": env})}
    )


def sub_score(record: dict[str, Any], name: str) -> float | None:
    """One sub-grader's score of a graded rollout (0 for a gated-off style or bonus); None
    when it was discarded or its grade failed."""
    grade = record.get("grade") or {}
    if record.get("discarded") or grade.get("error"):
        return None
    subs = grade.get("sub_scores") or {}
    return float(subs.get(name, 0.0))


def tests_by_row(records: list[dict[str, Any]]) -> dict[Any, float]:
    """The share of each row's rollouts that passed the tests (the gate)."""
    rows: dict[Any, list[float]] = {}
    for rec in records:
        if (v := sub_score(rec, "tests")) is not None:
            rows.setdefault(rec.get("row"), []).append(v)
    return {row: sum(v) / len(v) for row, v in rows.items()}


def headline(res: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, float]:
    kept = [r for r in records if not r.get("discarded")]

    def mean(name: str) -> float:
        vals = [v for r in kept if (v := sub_score(r, name)) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    edited = [
        r
        for r in kept
        if any(
            c.get("name") == "edit" for t in r.get("turns") or [] for c in t.get("tool_calls") or []
        )
    ]
    return {
        "reward": res["reward"]["mean"],
        "tests pass (gate)": mean("tests"),
        "style (when passed)": mean("style"),
        "validated bonus": mean("validated"),
        "share that called edit": len(edited) / max(1, len(kept)),
        "tool calls p50": res["tool_calls"]["p50"],
        "sampled tokens per rollout": res["sampled_tokens"]["mean"],
        "invalid tool calls": float(res["invalid_tool_calls"]),
    }


def measure(
    name: str, job: Job, train_items: list[Any], val_items: list[Any], out: Path
) -> dict[str, Any]:
    """Baseline on the held-out rows and the pre-flight on training rows, for one variant."""
    console.rule(
        f"{name}: baseline, the base model on {len(val_items)} held-out bugs x {EVAL_SAMPLES}"
    )
    before = evaluate_model(
        job, val_items, EVAL_SAMPLES, "base", out / "baseline", label="baseline"
    )
    console.print(summary_table(before, title=f"{name}: baseline"))
    console.rule(f"{name}: pre-flight, {PREFLIGHT_ROWS} training bugs x {PREFLIGHT_K}")
    rep = preflight_job(job, train_items[:PREFLIGHT_ROWS], PREFLIGHT_K, out / "preflight")
    print_preflight(rep)
    records = read_jsonl(out / "baseline/rollouts.jsonl")
    return {
        "baseline": headline(before, records),
        "baseline_result": before,
        "preflight": {k: rep[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
        "signal": rep["verdict"] not in ("broken", "no_reward"),
    }


def run(
    out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    console.rule("data: bugs injected into this repository's code, kept where its tests catch them")
    dirs = build_data(out)
    summary: dict[str, Any] = {"seed": seed, "variants": {}}
    trained_variant = None
    for name in VARIANTS:
        vout = out / name
        job = variant_job(name, dirs[name], vout, steps, seed, job_path)
        train_items = load_dataset(dirs[name] / "train.jsonl")
        val_items = load_dataset(dirs[name] / "val.jsonl")
        result = measure(name, job, train_items, val_items, vout)
        summary["variants"][name] = {k: v for k, v in result.items() if k != "baseline_result"}
        if result["signal"]:
            trained_variant = (name, job, val_items, vout, result)
            break
        console.print(
            f"[bold]{name}: {NO_REWARD}[/] (pre-flight verdict {result['preflight']['verdict']!r}); no training on it"
        )
    if trained_variant is None:
        summary["verdict"] = NO_REWARD + " (not even the easier variant): nothing trained"
    else:
        name, job, val_items, vout, result = trained_variant
        console.rule(f"{name}: train (the pre-flight found signal)")
        run_dir = train(job, vout / "run")
        console.rule(f"{name}: the trained model on the same held-out bugs")
        after = evaluate_model(
            job, val_items, EVAL_SAMPLES, str(run_dir), vout / "trained", label="trained"
        )
        console.print(summary_table(after, title=f"{name}: trained"))
        print_compare(result["baseline_result"], after, "base", "trained")
        base_records = read_jsonl(vout / "baseline/rollouts.jsonl")
        trained_records = read_jsonl(vout / "trained/rollouts.jsonl")
        a, b = headline(result["baseline_result"], base_records), headline(after, trained_records)
        a_rows, b_rows = tests_by_row(base_records), tests_by_row(trained_records)
        rows = sorted(set(a_rows) & set(b_rows))
        diff = paired_difference([b_rows[r] - a_rows[r] for r in rows])
        summary.update(
            trained=name,
            before=a,
            after=b,
            steps=len(read_metrics(run_dir)),
            per_row={
                "rows": {str(r): {"before": a_rows[r], "after": b_rows[r]} for r in rows},
                "difference": {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": diff.n},
            },
        )
        write_report(
            vout / "report.html",
            metrics=read_metrics(run_dir),
            before={"summary": result["baseline_result"], "rollouts": base_records},
            after={"summary": after, "rollouts": trained_records},
            rollouts=trained_records,
            title=f"agentrft demo: code fix ({name})",
        )
        width = max(map(len, a)) + 2
        console.print(f"\n{'held-out bugs (' + name + ')':<{width}}{'base':>10}{'trained':>10}")
        for key in a:
            console.print(f"{key:<{width}}{a[key]:>10.3f}{b[key]:>10.3f}")
        console.print(
            f"\ntests pass, trained - base, per held-out bug: {diff.mean:+.3f} (95% interval {diff.low:+.3f} .. {diff.high:+.3f}, {diff.n} bugs)"
        )
    summary["wall_s"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(f"\n{summary.get('verdict', 'trained: ' + str(summary.get('trained')))}")
    console.print(f"all outputs: {out}   ({summary['wall_s'] / 60:.1f} min)")
    return summary


def run_seeds(
    out: Path, seeds: list[int], steps: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    """`run` once per seed (out/seed-N; a finished seed is reused), then the gain in the
    held-out tests-pass rate with a 95% interval over every per-bug difference."""
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        done = out / f"seed-{seed}" / "summary.json"
        if done.is_file():
            per_seed[seed] = json.loads(done.read_text())
            console.print(f"seed {seed}: reusing the finished run in {done.parent}")
            continue
        per_seed[seed] = run(out / f"seed-{seed}", steps=steps, seed=seed, job_path=job_path)
    trained = {s: r for s, r in per_seed.items() if "per_row" in r}
    result: dict[str, Any] = {"seeds": {str(s): r for s, r in per_seed.items()}}
    if not trained:
        result["verdict"] = NO_REWARD + ": nothing trained on any seed"
        console.print(result["verdict"])
    else:
        diffs = [
            r["after"] - r["before"]
            for s in trained.values()
            for r in s["per_row"]["rows"].values()
        ]
        pooled = paired_difference(diffs)
        console.rule("all seeds: tests pass rate on the held-out bugs")
        console.print(f"{'seed':>6}{'base':>10}{'trained':>10}{'gain':>10}   95% interval")
        for seed, s in trained.items():
            d = s["per_row"]["difference"]
            x, y = s["before"]["tests pass (gate)"], s["after"]["tests pass (gate)"]
            console.print(
                f"{seed:>6}{x:>10.3f}{y:>10.3f}{y - x:>+10.3f}   {d['low']:+.3f} .. {d['high']:+.3f}"
            )
        console.print(
            f"{'pooled':>6}{'':>20}{pooled.mean:>+10.3f}   {pooled.low:+.3f} .. {pooled.high:+.3f}  ({pooled.n} bug differences)"
        )
        result["gain"] = {
            "mean": pooled.mean,
            "low": pooled.low,
            "high": pooled.high,
            "n": pooled.n,
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(result, indent=2, default=str))
    return result
