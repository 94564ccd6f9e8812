"""`agentrft demo kernels`: the kernel-writing recipe (the talk's Mako case) end to end.

    data -> baseline (best-of-3) -> pre-flight -> [train only on signal] -> the easier variant -> report

Rows come from tasks.yaml (`agentrft data kernels`). Every rollout is graded by job.yaml's
gated multi grader (static -> correct -> speed, in agentrft's sandbox), and the headline
counts how many rollouts each gate stopped. The shared runner (agentrft.tasks.runner) trains
only when the pre-flight finds signal; with SmolLM2-135M it finds none on the main job, which
the summary says plainly, and the easier variant (job_easy.yaml) is measured beside it, never
trained here. Everything lands in one folder (default runs/demo-kernels). Run it through
`agentrft demo kernels [--steps N] [--seed S] [--out DIR]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrft.job import Job
from agentrft.tasks import runner as recipes
from agentrft.tasks.kernels.dataset import BuildReport, build_dataset

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


def build_data(data: Path) -> BuildReport:
    """The rows of the task list (`data`), and the easier variant's (data-easy beside it:
    the same tasks, replies prefilled up to `return `)."""
    build_dataset(HERE / "tasks.yaml", data.parent / "data-easy", prefill=True)
    return build_dataset(HERE / "tasks.yaml", data)


def reward_by_row(records: list[dict[str, Any]]) -> dict[Any, float]:
    """Each row's mean reward over its graded rollouts."""
    rows: dict[Any, list[float]] = {}
    for r in records:
        if r.get("reward") is not None and not r.get("discarded"):
            rows.setdefault(r.get("row"), []).append(float(r["reward"]))
    return {row: sum(v) / len(v) for row, v in rows.items()}


def headline(res: dict[str, Any], records: list[dict[str, Any]], job: Job) -> dict[str, float]:
    """The reward, the first sample's and the best of BEST_OF, and how far rollouts got."""
    return {"reward": res["reward"]["mean"], **best_of(records, BEST_OF), **gate_counts(records)}


RECIPE = recipes.Recipe(
    title="kernels",
    folder=HERE,
    build_data=build_data,
    metric="reward",
    row_scores=reward_by_row,
    headline=headline,
    expected=lambda record: f"a correct, fast kernel for {record['item'].get('task')}",
    rows="tasks",
    select_val=lambda items: items[:VAL_ROWS],
    eval_samples=BEST_OF,
    preflight_rows=PREFLIGHT_ROWS,
    preflight_k=PREFLIGHT_K,
    variants=(
        recipes.Variant("task", "job.yaml", "data"),
        recipes.Variant("easier", "job_easy.yaml", "data-easy", train=False),
    ),
)
