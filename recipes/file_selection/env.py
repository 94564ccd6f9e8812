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
the repository-research recipe; this file sets their limits and adds the grader.

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
from pathlib import Path
from typing import Any

from agentrft.tools import repo_workspace as rw
from agentrft.tools.envkit import ToolServer, TraceContext
from agentrft.tools.repo_workspace import confine, create_workspace  # noqa: F401  (this recipe's API before the move)

# The limits the tools below read at each call (a test or a variant may change them here).
LIST_MAX_FILES = rw.LIST_MAX_FILES
GREP_MAX_MATCHES = rw.GREP_MAX_MATCHES
GREP_TIME_LIMIT_S = rw.GREP_TIME_LIMIT_S
READ_MAX_LINES = rw.READ_MAX_LINES
READ_MAX_CHARS = rw.READ_MAX_CHARS
LINE_MAX_CHARS = rw.LINE_MAX_CHARS
MAX_FILE_BYTES = rw.MAX_FILE_BYTES

env = ToolServer("file-selection")


# -- workspaces (agentrft.tools.repo_workspace: shared with the repository-research recipe) --
def workspace(ctx: TraceContext) -> Path:
    """The rollout's workspace of the item's `parent` commit, created by its first tool call.
    Grading needs none, so a rollout that answers without searching never pays for a checkout."""
    return rw.trace_workspace(ctx, "parent")


env.on_cleanup(rw.remove_workspace)


# -- tools ----------------------------------------------------------------------------------
@env.tool(description=rw.SEARCH_DESCRIPTION, parameters=rw.SEARCH_PARAMETERS)
def search(ctx: TraceContext, query: str) -> str:
    return rw.search_in(
        str(ctx.item.get("repo") or ""), str(ctx.item.get("parent") or ""), query, "parent"
    )


@env.tool(description=rw.LIST_FILES_DESCRIPTION, parameters=rw.LIST_FILES_PARAMETERS)
def list_files(ctx: TraceContext, path: str = ".", pattern: str | None = None) -> str:
    return rw.list_files_in(workspace(ctx), path, pattern, max_files=LIST_MAX_FILES)


@env.tool(description=rw.GREP_DESCRIPTION, parameters=rw.GREP_PARAMETERS)
def grep(
    ctx: TraceContext,
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    ignore_case: bool = False,
    files_only: bool = False,
) -> str:
    return rw.grep_in(
        workspace(ctx),
        pattern,
        path,
        glob,
        ignore_case,
        files_only,
        max_matches=GREP_MAX_MATCHES,
        time_limit_s=GREP_TIME_LIMIT_S,
        line_max_chars=LINE_MAX_CHARS,
        max_bytes=MAX_FILE_BYTES,
    )


@env.tool(description=rw.READ_FILE_DESCRIPTION, parameters=rw.READ_FILE_PARAMETERS)
def read_file(
    ctx: TraceContext, path: str, start_line: int = 1, end_line: int | None = None
) -> str:
    return rw.read_file_in(
        workspace(ctx),
        path,
        start_line,
        end_line,
        max_lines=READ_MAX_LINES,
        max_chars=READ_MAX_CHARS,
        max_bytes=MAX_FILE_BYTES,
    )


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
