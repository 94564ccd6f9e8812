"""`agentrft demo repo_research`: the repository-research recipe end to end, on questions about
this repository's own code.

    data -> baseline eval -> pre-flight -> train -> eval of the trained model -> compare + report

The questions are built from the code at PINNED_REV, so every clone builds the same rows.
Everything lands in one folder (default runs/demo-repo_research). Run it through
`agentrft demo repo_research [--steps N] [--seed S] [--out DIR] [--job job_cliff.yaml]`, and
over several seeds with `--seeds 1 2 3`. The steps themselves are the runner every recipe
shares (agentrft.tasks.runner); this file says what is this recipe's own: its data, its measure
(fact recall per held-out question) and the numbers it reports, tool-call tail included.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agentrft.evaluate.report import record_tool_call_tokens
from agentrft.job import Job
from agentrft.rollout.records import distribution
from agentrft.tasks import runner as recipes
from agentrft.tasks.repo_research.dataset import build_dataset

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # the agentrft checkout
PINNED_REV = "73d01a1e19d177ebfeb23dbff07d1f6e107b01e8"  # the code the questions are about: every clone builds the same rows
INCLUDE = (
    "agentrft/",
)  # questions about the package's code (tests, benchmarks and recipes left out)
VAL_ROWS = 24  # held-out questions evaluated, spread over the validation file
EVAL_SAMPLES = 2  # rollouts per held-out question, before and after
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 8
TAIL_CALLS = 4  # a rollout with more calls than this is in the tail the budget should remove
WORKED_EXAMPLES = (
    4  # one per kind whose first call shows the answer: where, returns, default, imports
)


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


def headline(res: dict[str, Any], records: list[dict[str, Any]], job: Job) -> dict[str, float]:
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
        "tool calls per turn": recipes.calls_per_turn(kept),
        "invalid tool calls": float(res["invalid_tool_calls"]),
    }


def spread(items: list[Any], n: int) -> list[Any]:
    """`n` items evenly spaced over the list."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def each_kind(items: list[Any], n: int) -> list[Any]:
    """`n` training questions taken in turn from each kind, in file order: the pre-flight's
    rows. The first `n` rows of the file can all be of the kinds the base model never
    answers (where_defined, docstring), which reads as no reward at all."""
    by_kind: dict[str, list[Any]] = {}
    for item in items:
        by_kind.setdefault(item.fields.get("kind", ""), []).append(item)
    queues = list(by_kind.values())
    out: list[Any] = []
    while len(out) < min(n, len(items)):
        for queue in queues:
            if queue and len(out) < n:
                out.append(queue.pop(0))
    return out


RECIPE = recipes.Recipe(
    title="repository research",
    folder=HERE,
    build_data=functools.partial(
        build_dataset, REPO, rev=PINNED_REV, include=INCLUDE, worked_examples=WORKED_EXAMPLES
    ),
    too_few_rows=f"{REPO}: too few questions for the demo",
    metric="fact recall",
    row_scores=recall_by_row,
    headline=headline,
    expected=lambda record: "; ".join(record["item"].get("facts", [])),
    rows="questions",
    select_val=functools.partial(spread, n=VAL_ROWS),
    eval_samples=EVAL_SAMPLES,
    preflight_rows=PREFLIGHT_ROWS,
    preflight_k=PREFLIGHT_K,
    select_preflight=each_kind,
    seed_columns=("tool calls p95", "tool calls max"),
)
