"""File-selection environment (stage: rollout tools + endpoint grader) for rows built by
`agentrft data from-git`: the model searches the repository as it was before a commit and
answers with the files that commit changed.

Each rollout (`trace_id`) gets its own workspace: the item's `parent` commit exported with
`git archive | tar -x` into a fresh temporary directory on its first tool call (grading needs
none), and deleted after grading, on POST /cleanup, on the idle TTL, or when the server stops.
`git archive` only reads the repository, so concurrent rollouts never contend on it, and the
workspace holds no `.git`: the answer commit cannot leak through history. (Measured faster
than `git worktree add`; files marked `export-ignore` in `.gitattributes` are left out, as in
any archive.) The workspace and the tools are `agentrft.tools.repo_workspace`, shared with
the repository-research recipe (`register_repo_tools`); this file adds the grader.

Tools: search (ranked, BM25 over paths, identifiers and text), list_files, grep, read_file. Every path is relative to the repository root and confined
to the workspace: `..`, absolute paths and symlinks leading outside are refused. A call the
model got wrong (bad regex, missing file) is a 400 whose text the model sees.

Run by agentrft for the job (job.yaml, `agentrft.environment`), or by hand:
    uvicorn env:app --port 8700
Workspaces go under $AGENTRFT_WORKSPACE_DIR (default: the system temp directory).
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrft.tools.envkit import ToolServer, TraceContext
from agentrft.tools.repo_workspace import register_repo_tools

env = ToolServer("file-selection")
tools = register_repo_tools(env, field="parent")


# -- grader ---------------------------------------------------------------------------------
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def parse_paths(answer: str) -> list[str]:
    """The paths in a final answer: a JSON list of strings, else one path per line
    (bullets, numbering, quotes and backticks stripped)."""
    text = re.sub(r"^```\w*\s*|```\s*$", "", answer.strip())
    start, end = text.find("["), text.rfind("]")
    if start != -1 and end > start:
        try:
            items = json.loads(text[start : end + 1])
            if isinstance(items, list) and all(isinstance(p, str) for p in items):
                return [p.strip().removeprefix("./") for p in items if p.strip()]
        except json.JSONDecodeError:
            pass
    paths = (
        _BULLET.sub("", line).strip().strip("`'\",").removeprefix("./")
        for line in text.splitlines()
    )
    return [p for p in paths if p]


def file_f1(predicted: list[str], expected: list[str]) -> float:
    """Set F1 of predicted against expected paths; 1.0 when both are empty."""
    pred, gold = set(predicted), set(expected)
    if not pred and not gold:
        return 1.0
    hits = len(pred & gold)
    return 0.0 if hits == 0 else 2 * hits / (len(pred) + len(gold))


@env.grader
def grade(ctx: TraceContext, sample: dict[str, Any], item: dict[str, Any]) -> dict[str, float]:
    return {
        "score": file_f1(
            parse_paths(str(sample.get("output_text") or "")), list(item.get("files") or [])
        )
    }


app = env.app
