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
from pathlib import Path
from typing import Any

from agentrft.data.jsonl import write_jsonl
from agentrft.job import Job
from agentrft.tasks import runner as recipes
from agentrft.tasks.code_fix.dataset import BuildReport, build_dataset, hinted
from agentrft.tools.envkit import free_port

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
VARIANTS = (  # measured in order; the first whose pre-flight finds signal is trained
    recipes.Variant("task", "job.yaml", "data"),  # the failing test and its output only
    recipes.Variant("easier", "job_easy.yaml", "data-easy"),  # the edit prefilled on the line
)


def build_data(data: Path) -> BuildReport:
    """The rows once (the bugs and their test runs: `data`, the task as is), then the easier
    variant's prompt of the same bugs (data-easy beside it)."""
    report = build_dataset(REPO, data, rev=PINNED_REV, include=INCLUDE, max_per_file=MAX_PER_FILE)
    easy = data.parent / "data-easy"
    for split in ("train", "val"):
        rows = [json.loads(x) for x in (data / f"{split}.jsonl").read_text().splitlines()]
        write_jsonl(easy / f"{split}.jsonl", (hinted(r, "line") for r in rows))
    return report


def variant_job(
    folder: Path, data: Path, out: Path, steps: int | None, seed: int | None, job_path: Path | None
) -> Job:
    """The variant's job (runner.demo_job) with its environment and graders on a free port
    (so demos can run side by side)."""
    job = recipes.demo_job(folder, data, out, steps, seed, job_path)
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


def headline(res: dict[str, Any], records: list[dict[str, Any]], job: Job) -> dict[str, float]:
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


RECIPE = recipes.Recipe(
    title="code fix",
    folder=HERE,
    build_data=build_data,
    too_few_rows=f"{REPO}: too few bugs kept for the demo",
    metric="tests pass (gate)",
    row_scores=tests_by_row,
    headline=headline,
    expected=lambda record: f"the tests of {', '.join(record['item'].get('files', []))} pass",
    rows="bugs",
    eval_samples=EVAL_SAMPLES,
    preflight_rows=PREFLIGHT_ROWS,
    preflight_k=PREFLIGHT_K,
    variants=VARIANTS,
    variant_job=variant_job,
)
