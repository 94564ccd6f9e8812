"""`make demo`: the file-selection recipe end to end, on this repository's own git history.

    data -> baseline eval -> pre-flight -> train -> eval of the trained model -> compare + report

The dataset is built from the history up to PINNED_REV, so every clone builds the same rows
(later commits do not shift the numbers). Everything lands in one folder (default runs/demo).
Run it through `make demo` or `agentrft demo [--steps N] [--seed S] [--out DIR]`, and over
several seeds with `agentrft demo --seeds 1 2 3`. The steps themselves are the runner every
recipe shares (agentrft.tasks.runner); this file says what is this recipe's own: its data, its
measure (exact file F1 per held-out row) and the numbers it reports.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agentrft.evaluate.estimators import row_means
from agentrft.job import Job
from agentrft.tasks import runner as recipes
from agentrft.tasks.file_selection.dataset import build_dataset

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # the agentrft checkout
PINNED_REV = "2fc09be9e65b91fff88eb8c40650deed8b9acf28"  # history up to this commit: every clone builds the same rows
VAL_FRACTION = 0.25  # the newest quarter of the kept commits: 16 held-out rows at PINNED_REV


def headline(res: dict[str, Any], records: list[dict[str, Any]], job: Job) -> dict[str, float]:
    """The numbers the README reports for one evaluation: the reward (named by the job's
    calculate_output), then each sub-grader's mean, then the tool use."""
    formula = job.rl.grader.get("calculate_output", job.rl.grader["type"])
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
        "tool calls per turn": recipes.calls_per_turn(records),
    }


RECIPE = recipes.Recipe(
    title="file selection",
    folder=HERE,
    build_data=functools.partial(build_dataset, REPO, rev=PINNED_REV, val_fraction=VAL_FRACTION),
    too_few_rows=f"{REPO}: too little git history for the demo; it needs a full clone, not a shallow one",
    metric="mean file F1",
    row_scores=functools.partial(row_means, score="files"),
    headline=headline,
    expected=lambda record: ", ".join(record["item"].get("files", [])),
)
