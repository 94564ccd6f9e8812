"""`agentrft demo repo_research`: the repository-research recipe end to end, on questions about
this repository's own code.

    data -> baseline eval -> pre-flight -> train -> eval of the trained model -> compare + report

The questions are built from the code at PINNED_REV, so every clone builds the same rows.
Everything lands in one folder (default runs/demo-repo_research). Run it through
`agentrft demo repo_research [--steps N] [--seed S] [--out DIR] [--job job_cliff.yaml]`, and
over several seeds with `--seeds 1 2 3` (recipe interface: agentrft.recipes). The job plumbing
and the calls-per-turn count are the file-selection demo's (loaded, not copied).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrft import recipes
from agentrft.console import console, show_messages, summary_table
from agentrft.data import load_dataset
from agentrft.data.repo_qa import build_dataset
from agentrft.errors import ConfigError
from agentrft.evaluate.commands import evaluate_model, preflight_job, print_compare, print_preflight
from agentrft.evaluate.estimators import paired_difference
from agentrft.evaluate.report import record_tool_call_tokens, write_report
from agentrft.rollout.records import distribution, read_jsonl
from agentrft.train.loop import train
from agentrft.train.observe import read_metrics

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PINNED_REV = "73d01a1e19d177ebfeb23dbff07d1f6e107b01e8"  # the code the questions are about: every clone builds the same rows
INCLUDE = (
    "agentrft/",
)  # questions about the package's code (tests, benchmarks and recipes left out)
VAL_ROWS = 24  # held-out questions evaluated, spread over the validation file
EVAL_SAMPLES = 2  # rollouts per held-out question, before and after
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 8
TAIL_CALLS = 4  # a rollout with more calls than this is in the tail the budget should remove

_file_selection = recipes.load(
    "file_selection"
)  # demo_job (the job pointed at the demo's data) and calls_per_turn


def recall_of(record: dict[str, Any]) -> float | None:
    """The fact recall of one graded rollout: the `facts` sub-score; a rollout cut off by the
    hard budget gave no answer, so it recalled nothing; an ungraded or discarded one is None."""
    grade = record.get("grade") or {}
    if record.get("discarded") or grade.get("error"):
        return None
    if (grade.get("metrics") or {}).get("over_budget"):
        return 0.0
    value = (grade.get("sub_scores") or {}).get("facts")
    return float(value) if isinstance(value, int | float) else None


def recall_by_row(records: list[dict[str, Any]]) -> dict[Any, float]:
    rows: dict[Any, list[float]] = {}
    for rec in records:
        if (value := recall_of(rec)) is not None:
            rows.setdefault(rec.get("row"), []).append(value)
    return {row: sum(v) / len(v) for row, v in rows.items()}


def headline(res: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, float]:
    """The numbers the README reports for one evaluation."""
    kept = [r for r in records if not r.get("discarded")]
    recalls = [v for r in kept if (v := recall_of(r)) is not None]
    calls = distribution([float(r.get("num_tool_calls", 0)) for r in kept])
    return {
        "reward": res["reward"]["mean"],
        "fact recall": sum(recalls) / len(recalls) if recalls else float("nan"),
        "tool calls mean": calls["mean"],
        "tool calls p50": calls["p50"],
        "tool calls p95": calls["p95"],
        "tool calls max": calls["max"],
        f"share with > {TAIL_CALLS} calls": sum(
            r.get("num_tool_calls", 0) > TAIL_CALLS for r in kept
        )
        / max(1, len(kept)),
        "tokens sent to tools": distribution([float(record_tool_call_tokens(r)) for r in kept])[
            "mean"
        ],
        "sampled tokens per rollout": res["sampled_tokens"]["mean"],
        "tool calls per turn": _file_selection.calls_per_turn(kept),
        "invalid tool calls": float(res["invalid_tool_calls"]),
    }


def per_row_recall(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Fact recall per held-out question, before and after, and the paired difference."""
    a, b = recall_by_row(before), recall_by_row(after)
    rows = sorted(set(a) & set(b))
    diff = paired_difference([b[r] - a[r] for r in rows])
    return {
        "rows": {str(r): {"before": a[r], "after": b[r]} for r in rows},
        "difference": {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": diff.n},
    }


def spread(items: list[Any], n: int) -> list[Any]:
    """`n` items evenly spaced over the list."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def show_best_rollout(records: list[dict[str, Any]], label: str) -> None:
    with_calls = [r for r in records if r.get("num_tool_calls") and r.get("reward") is not None]
    if not with_calls:
        console.print(f"({label}: no rollout called a tool)")
        return
    best = max(with_calls, key=lambda r: r["reward"])
    messages = best["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    show_messages(
        messages[start:],
        f"{label}: best rollout with a tool call  reward={best['reward']:.3f}  facts: {best['item'].get('facts')}",
        max_chars=600,
    )


def run(
    out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    console.rule("1/6 data: questions about this repository's code")
    report = build_dataset(REPO, out / "data", rev=PINNED_REV, include=INCLUDE)
    for line in report.lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if report.train < PREFLIGHT_ROWS or report.val < 2:
        raise ConfigError(
            f"{REPO}: too few questions for the demo ({report.train} train / {report.val} val rows)"
        )
    job = _file_selection.demo_job(
        out / "data", out, steps, seed, job_path.resolve() if job_path else HERE / "job.yaml"
    )
    train_items = load_dataset(out / "data/train.jsonl")
    val_items = spread(load_dataset(out / "data/val.jsonl"), VAL_ROWS)

    console.rule(
        f"2/6 baseline: the base model on {len(val_items)} held-out questions x {EVAL_SAMPLES}"
    )
    before = evaluate_model(
        job, val_items, EVAL_SAMPLES, "base", out / "baseline", label="baseline"
    )
    console.print(summary_table(before, title="baseline"))

    console.rule(f"3/6 pre-flight: {PREFLIGHT_ROWS} training questions x {PREFLIGHT_K}")
    rep = preflight_job(job, train_items[:PREFLIGHT_ROWS], PREFLIGHT_K, out / "preflight")
    print_preflight(rep)
    if rep["verdict"] in ("broken", "no_reward"):
        raise ConfigError(
            f"pre-flight verdict {rep['verdict']!r}: training would learn nothing; see {out / 'preflight'} and the advice above"
        )

    console.rule("4/6 train")
    run_dir = train(job, out / "run")

    console.rule("5/6 the trained model on the same held-out questions")
    after = evaluate_model(
        job, val_items, EVAL_SAMPLES, str(run_dir), out / "trained", label="trained"
    )
    console.print(summary_table(after, title="trained"))

    console.rule("6/6 compare")
    print_compare(before, after, "base", "trained")
    base_records, trained_records = (
        read_jsonl(out / "baseline/rollouts.jsonl"),
        read_jsonl(out / "trained/rollouts.jsonl"),
    )
    a, b = headline(before, base_records), headline(after, trained_records)
    paired = per_row_recall(base_records, trained_records)
    summary = {
        "before": a,
        "after": b,
        "preflight": {k: rep[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
        "job": str(job.source),
        "steps": len(read_metrics(run_dir)),
        "seed": job.seed,
        "rows": {"train": len(train_items), "val": len(val_items)},
        "per_row_fact_recall": paired,
        "wall_s": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    page = write_report(
        out / "report.html",
        metrics=read_metrics(run_dir),
        before={"summary": before, "rollouts": base_records},
        after={"summary": after, "rollouts": trained_records},
        rollouts=trained_records,
        title="agentrft demo: repository research",
    )
    show_best_rollout(trained_records, "trained model, held-out question")
    width = max(map(len, a)) + 2
    console.print(f"\n{'held-out questions':<{width}}{'base':>10}{'trained':>10}")
    for k in a:
        console.print(f"{k:<{width}}{a[k]:>10.3f}{b[k]:>10.3f}")
    d = paired["difference"]
    console.print(
        f"\nfact recall, trained - base, per held-out question: {d['mean']:+.3f} (95% interval {d['low']:+.3f} .. {d['high']:+.3f}, {d['n']} questions)"
    )
    console.print(f"\nreport: {page}\nall outputs: {out}   ({summary['wall_s'] / 60:.1f} min)")
    return summary


def run_seeds(
    out: Path, seeds: list[int], steps: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    """The whole demo once per seed (out/seed-N), then the mean fact-recall gain with a 95%
    interval over all per-question differences."""
    per_seed = {}
    for i, seed in enumerate(seeds):
        console.rule(f"[bold]seed {seed} ({i + 1} of {len(seeds)})")
        per_seed[seed] = run(out / f"seed-{seed}", steps=steps, seed=seed, job_path=job_path)
    diffs = [
        r["after"] - r["before"]
        for s in per_seed.values()
        for r in s["per_row_fact_recall"]["rows"].values()
    ]
    pooled = paired_difference(diffs)
    console.rule("all seeds: fact recall and tool calls on the held-out questions")
    console.print(
        f"{'seed':>6}{'recall base':>13}{'trained':>10}{'p95 calls base':>16}{'trained':>10}"
    )
    for seed, s in per_seed.items():
        console.print(
            f"{seed:>6}{s['before']['fact recall']:>13.3f}{s['after']['fact recall']:>10.3f}"
            f"{s['before']['tool calls p95']:>16.1f}{s['after']['tool calls p95']:>10.1f}"
        )
    mean_a = sum(s["before"]["fact recall"] for s in per_seed.values()) / len(per_seed)
    mean_b = sum(s["after"]["fact recall"] for s in per_seed.values()) / len(per_seed)
    console.print(
        f"mean recall {mean_a:.3f} -> {mean_b:.3f}, gain {pooled.mean:+.3f} (95% interval {pooled.low:+.3f} .. {pooled.high:+.3f}, {pooled.n} question differences)"
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
