"""`agentrft demo kernels`: the kernel-writing recipe (the talk's Mako case) end to end.

    data -> baseline (best-of-3) -> pre-flight -> [train only on signal] -> the easier variant -> report

Rows come from tasks.yaml (`agentrft data kernels`). Every rollout is graded by job.yaml's
gated multi grader (static -> correct -> speed, in agentrft's sandbox), and the report counts
how many rollouts each gate stopped. Training runs only when the pre-flight finds signal; with
SmolLM2-135M it finds none on the main job, which the summary says plainly, and the easier
variant (job_easy.yaml) is measured beside it. Everything lands in one folder (default
runs/demo-kernels). Run it through `agentrft demo kernels [--steps N] [--seed S] [--out DIR]`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrft.console import console, show_messages, summary_table
from agentrft.data import load_dataset
from agentrft.evaluate.commands import evaluate_model, preflight_job, print_preflight
from agentrft.rollout.records import read_jsonl
from agentrft.tasks import runner as recipes
from agentrft.tasks.kernels.dataset import build_dataset
from agentrft.train.loop import train

HERE = Path(__file__).resolve().parent
BEST_OF = 3  # the talk's best-of-3 at inference
VAL_ROWS = 8  # every held-out task
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 4
GATES = ("static", "checked.correct")


def gate_counts(records: list[dict[str, Any]]) -> dict[str, float]:
    """How far graded rollouts got: the share stopped at each gate, and that passed both."""
    graded = [
        r for r in records if not r.get("discarded") and not (r.get("grade") or {}).get("error")
    ]
    n = max(1, len(graded))
    subs = [(r.get("grade") or {}).get("sub_scores") or {} for r in graded]
    static_ok = [s for s in subs if s.get("static") == 1.0]
    correct = [s for s in static_ok if s.get("checked.correct") == 1.0]
    return {
        "rollouts graded": float(len(graded)),
        "stopped by static gate": (len(subs) - len(static_ok)) / n,
        "stopped by correctness gate": (len(static_ok) - len(correct)) / n,
        "correct (scored for speed)": len(correct) / n,
    }


def best_of(records: list[dict[str, Any]], k: int) -> dict[str, float]:
    """Mean over rows of the first sample's reward and of the best of the first k."""
    rows: dict[Any, list[float]] = {}
    for r in records:
        if r.get("reward") is not None and not r.get("discarded"):
            rows.setdefault(r.get("row"), []).append(float(r["reward"]))
    firsts = [v[0] for v in rows.values()]
    bests = [max(v[:k]) for v in rows.values()]
    return {
        "single sample": sum(firsts) / max(1, len(firsts)),
        f"best-of-{k}": sum(bests) / max(1, len(bests)),
        "rows": float(len(rows)),
    }


def evaluate(
    job: Any, items: list[Any], out: Path, label: str, model: str = "base"
) -> dict[str, Any]:
    res = evaluate_model(job, items, BEST_OF, model, out, label=label)
    records = read_jsonl(out / "rollouts.jsonl")
    console.print(summary_table(res, title=label))
    summary = {"reward": res["reward"]["mean"], **best_of(records, BEST_OF), **gate_counts(records)}
    for k, v in summary.items():
        console.print(f"  {k:<30}{v:>8.3f}")
    return summary


def show_best(records: list[dict[str, Any]], label: str) -> None:
    if not records:
        return
    best = max(records, key=lambda r: r.get("reward") or 0.0)
    show_messages(
        best["messages"][-1:],
        f"{label}: best rollout  reward={best.get('reward')}  task={best['item'].get('task')}  sub-scores={(best.get('grade') or {}).get('sub_scores')}",
        max_chars=700,
    )


def run(
    out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    console.rule("1/5 data: the task list, validated")
    report = build_dataset(HERE / "tasks.yaml", out / "data")
    for line in report.lines():
        console.print(line, highlight=False, markup=False)
    job = recipes.demo_job(
        HERE, out / "data", out, steps, seed, (job_path or HERE / "job.yaml").resolve()
    )
    train_items = load_dataset(out / "data/train.jsonl")[:PREFLIGHT_ROWS]
    val_items = load_dataset(out / "data/val.jsonl")[:VAL_ROWS]

    console.rule(
        f"2/5 baseline: the base model on {len(val_items)} held-out tasks x {BEST_OF} (best-of-{BEST_OF})"
    )
    baseline = evaluate(job, val_items, out / "baseline", "baseline")

    console.rule(f"3/5 pre-flight: {len(train_items)} training tasks x {PREFLIGHT_K}")
    rep = preflight_job(job, train_items, PREFLIGHT_K, out / "preflight")
    print_preflight(rep)
    summary: dict[str, Any] = {
        "job": str(job.source),
        "seed": job.seed,
        "baseline": baseline,
        "preflight": {k: rep[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
        "preflight_gates": gate_counts(read_jsonl(out / "preflight/rollouts.jsonl")),
    }

    console.rule("4/5 train (only when the pre-flight finds signal)")
    if rep["verdict"] in ("learnable", "weak_signal"):
        run_dir = train(job, out / "run")
        summary["trained"] = evaluate(job, val_items, out / "trained", "trained", str(run_dir))
    else:
        summary["trained"] = None
        console.print(
            f"[bold red]{rep['verdict']}: this model never passes the gate[/] "
            f"(rewards {rep['reward_min']:.3g} .. {rep['reward_max']:.3g}); training would learn nothing, so it is skipped"
        )

    console.rule(
        "5/5 the easier variant (job_easy.yaml): same gates and tasks, replies prefilled up to `return `"
    )
    build_dataset(HERE / "tasks.yaml", out / "data-easy", prefill=True)
    easy = recipes.demo_job(HERE, out / "data-easy", out, steps, seed, HERE / "job_easy.yaml")
    train_items = load_dataset(out / "data-easy/train.jsonl")[:PREFLIGHT_ROWS]
    val_items = load_dataset(out / "data-easy/val.jsonl")[:VAL_ROWS]
    easy_rep = preflight_job(easy, train_items, PREFLIGHT_K, out / "easy-preflight")
    print_preflight(easy_rep)
    summary["easy_preflight"] = {
        k: easy_rep[k] for k in ("verdict", "rows_with_signal", "best_of_k")
    }
    summary["easy_preflight_gates"] = gate_counts(read_jsonl(out / "easy-preflight/rollouts.jsonl"))
    summary["easy_baseline"] = evaluate(
        easy, val_items, out / "easy-baseline", "easy variant, base model"
    )
    show_best(read_jsonl(out / "easy-baseline/rollouts.jsonl"), "easy variant, held-out task")
    if easy_rep["verdict"] in ("learnable", "weak_signal"):
        console.print(
            "the easier variant has signal: `agentrft train agentrft/tasks/kernels/job_easy.yaml` trains it (not part of the timed demo)"
        )

    summary["wall_s"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"\nall outputs: {out}   ({summary['wall_s'] / 60:.1f} min)")
    return summary
