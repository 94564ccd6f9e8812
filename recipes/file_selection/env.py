"""File-selection environment (stage: rollout tools + endpoint grader) for rows built by
`agentrft data from-git`: the model searches the repository as it was before a commit and
answers with the files that commit changed.

Each rollout (`trace_id`) gets its own workspace: the item's `parent` commit exported with
`git archive | tar -x` into a fresh temporary directory on its first tool call (grading needs
none), and deleted after grading, on POST /cleanup, on the idle TTL, or when the server stops.
`git archive` only reads the repository, so concurrent rollouts never contend on it, and the
workspace holds no `.git`: the answer commit cannot leak through history. (Measured faster
than `git worktree add`; files marked `export-ignore` in `.gitattributes` are left out, as in
any archive.)

Tools: search (ranked, BM25 over paths, identifiers and text), list_files, grep, read_file. Every path is relative to the repository root and confined
to the workspace: `..`, absolute paths and symlinks leading outside are refused. A call the
model got wrong (bad regex, missing file) is a 400 whose text the model sees.

Run by agentrft for the job (job.yaml, `agentrft.environment`), or by hand:
    uvicorn env:app --port 8700
Workspaces go under $AGENTRFT_WORKSPACE_DIR (default: the system temp directory).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import functools

import pathspec
import regex

from agentrft.tools.code_search import DEFAULT_TOP_K, CodeIndex, numbered
from agentrft.tools.envkit import ToolInputError, ToolServer, TraceContext

LIST_MAX_FILES = 100
GREP_MAX_MATCHES = 20
GREP_TIME_LIMIT_S = 10.0
READ_MAX_LINES = 60
READ_MAX_CHARS = 16_000
LINE_MAX_CHARS = 120  # grep shows at most this much of a matching line
MAX_FILE_BYTES = 1 << 20  # grep and read_file skip larger files
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")

env = ToolServer("file-selection")


# -- workspaces -----------------------------------------------------------------------------
def create_workspace(repo: str, commit: str, label: str = "") -> Path:
    """Export `commit` of `repo` into a new directory and return its resolved path."""
    if not _SHA.match(commit or ""):
        raise RuntimeError(f"item field `parent` must be a commit hash, got {commit!r}")
    if not repo or not Path(repo).is_dir():
        raise RuntimeError(f"item field `repo` is not a directory on the environment's machine: {repo!r}")
    base = os.environ.get("AGENTRFT_WORKSPACE_DIR") or None
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", label)[:64]
    root = Path(tempfile.mkdtemp(prefix=f"agentrft-ws-{safe}-", dir=base)).resolve()
    try:
        archive = subprocess.Popen(["git", "-C", repo, "archive", "--format=tar", commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tar = subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, capture_output=True)
        assert archive.stdout is not None and archive.stderr is not None
        archive.stdout.close()
        err = archive.stderr.read()
        if archive.wait() != 0 or tar.returncode != 0:
            raise RuntimeError(f"cannot export {commit} of {repo}: {(err or tar.stderr).decode(errors='replace').strip()}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def workspace(ctx: TraceContext) -> Path:
    """The rollout's workspace, created by its first tool call. Grading needs none, so a
    rollout that answers without searching never pays for a checkout."""
    with ctx.lock:  # parallel calls of one turn share one workspace; cleanup takes it too
        if ctx.state.get("closed"):
            raise RuntimeError(f"trace {ctx.trace_id} was already cleaned up")
        if "root" not in ctx.state:
            ctx.state["root"] = create_workspace(str(ctx.item.get("repo") or ""), str(ctx.item.get("parent") or ""), ctx.trace_id)
        root: Path = ctx.state["root"]
        return root


@env.on_cleanup
def cleanup(ctx: TraceContext) -> None:
    ctx.state["closed"] = True
    root = ctx.state.pop("root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def confine(root: Path, path: str) -> Path:
    """`path` (relative to the repository root) resolved inside `root`, or ToolInputError."""
    if not isinstance(path, str) or "\0" in path:
        raise ToolInputError("`path` must be a string")
    rel = PurePosixPath(path.strip() or ".")
    if rel.is_absolute() or path.strip().startswith("~"):
        raise ToolInputError(f"{path!r} is absolute; paths are relative to the repository root, e.g. \"src/app.py\"")
    if ".." in rel.parts:
        raise ToolInputError(f"{path!r} contains `..`; paths stay inside the repository")
    full = (root / rel).resolve()
    if not full.is_relative_to(root):
        raise ToolInputError(f"{path!r} points outside the repository")
    return full


def _glob(pattern: str | None) -> pathspec.PathSpec | None:
    """A glob in gitignore syntax ("*.py" matches at any depth), or ToolInputError."""
    if not pattern:
        return None
    try:
        return pathspec.PathSpec.from_lines("gitwildmatch", [pattern])
    except (ValueError, TypeError) as exc:
        raise ToolInputError(f"bad glob {pattern!r}: {exc}") from None


def _files(root: Path, start: Path, spec: pathspec.PathSpec | None) -> Iterator[tuple[str, Path]]:
    """(path relative to `root`, absolute path) of the files under `start`, sorted, whose path
    relative to `start` matches `spec`."""
    if start.is_file():
        walk: Any = [(str(start.parent), [], [start.name])]
    else:
        walk = os.walk(start)
    for dirpath, dirnames, filenames in walk:
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if spec is None or spec.match_file(full.relative_to(start if start.is_dir() else start.parent).as_posix()):
                yield full.relative_to(root).as_posix(), full


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ToolInputError(f"`{name}` must be an integer, got {value!r}") from None


def _read_text(full: Path) -> str | None:
    """The file's text with CRLF as LF, or None when it is binary or too large."""
    if full.stat().st_size > MAX_FILE_BYTES:
        return None
    data = full.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


def _lines(text: str) -> list[str]:
    """Lines as git and grep count them (split at LF only), so grep's line numbers are
    read_file's line numbers even in files holding form feeds or other separators."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


# Constructs that can match within one line but not at the same place in the whole file.
_LINE_ONLY = re.compile(r"\\[AZzG]|\(\?<?[=!]")


def _grep_lines(root: Path, start: Path, spec: pathspec.PathSpec | None, rx: Any, deadline: float) -> Iterator[tuple[str, str]]:
    """(path, "path:line: text") for each matching line of the text files under `start`; raises
    TimeoutError once `deadline` (time.monotonic) passes, even inside one slow match.
    A file is first searched whole (one C-level scan; measured 5x faster when nothing matches):
    with MULTILINE and without the constructs of _LINE_ONLY, every line match is also a
    whole-file match, so a file without one is skipped without changing the result."""
    whole = None if _LINE_ONLY.search(rx.pattern) else regex.compile(rx.pattern, rx.flags | regex.MULTILINE)

    def left() -> float:
        return max(deadline - time.monotonic(), 0.001)

    for rel, full in _files(root, start, spec):
        if not full.is_file() or not full.resolve().is_relative_to(root):
            continue  # a broken symlink, or one leading outside the workspace
        text = _read_text(full)
        if text is None or (whole is not None and not whole.search(text, timeout=left())):
            continue
        for lineno, line in enumerate(_lines(text), start=1):
            if rx.search(line, timeout=left()):
                yield rel, f"{rel}:{lineno}: {line.strip()[:LINE_MAX_CHARS]}"


# -- tools ----------------------------------------------------------------------------------
_index_lock = threading.Lock()
_building: dict[tuple[str, str], threading.Lock] = {}


@functools.lru_cache(maxsize=16)
def _built_index(repo: str, commit: str) -> CodeIndex:
    return CodeIndex.from_git(repo, commit)


def _index(repo: str, commit: str) -> CodeIndex:
    """One search index per revision, shared by every rollout on it (read from git: the
    rollout's workspace is not needed, and the index cannot see other revisions). The
    rollouts of a group search the same revision at once: one builds it, the rest wait."""
    if not _SHA.match(commit or ""):
        raise RuntimeError(f"item field `parent` must be a commit hash, got {commit!r}")
    if not repo or not Path(repo).is_dir():
        raise RuntimeError(f"item field `repo` is not a directory on the environment's machine: {repo!r}")
    with _index_lock:
        lock = _building.setdefault((repo, commit), threading.Lock())
    with lock:
        return _built_index(repo, commit)


@env.tool(
    description=f"Ranked search over the repository's file paths, names and text; returns the {DEFAULT_TOP_K} best-matching files, best first, one numbered line each: N. path  (matches: words).",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "Words to look for, e.g. \"parse commit log\"; any wording works."}},
        "required": ["query"],
        "additionalProperties": False,
    },
)
def search(ctx: TraceContext, query: str) -> str:
    if not isinstance(query, str) or not query.strip():
        raise ToolInputError("`query` must be a non-empty string of words, e.g. \"parse commit log\"")
    hits = _index(str(ctx.item.get("repo") or ""), str(ctx.item.get("parent") or "")).search(query)
    if not hits:
        return f"no files match {query!r}; try other words"
    return numbered(hits)


_PATH = {"type": "string", "description": "Directory or file relative to the repository root (default: the root)."}
_GLOB = {"type": "string", "description": "Only files matching this glob (relative to `path`), e.g. \"*.py\" or \"tests/**/test_*.py\"."}


@env.tool(
    description=f"List the repository's files (at most {LIST_MAX_FILES}), optionally under a directory and matching a glob.",
    parameters={"type": "object", "properties": {"path": _PATH, "pattern": _GLOB}, "additionalProperties": False},
)
def list_files(ctx: TraceContext, path: str = ".", pattern: str | None = None) -> str:
    root = workspace(ctx)
    start = confine(root, path)
    if not start.exists():
        raise ToolInputError(f"no such directory: {path!r}")
    found = [rel for rel, _ in _files(root, start, _glob(pattern))]
    if not found:
        return f"no files under {path!r}" + (f" matching {pattern!r}" if pattern else "")
    shown = "\n".join(found[:LIST_MAX_FILES])
    if len(found) > LIST_MAX_FILES:
        shown += f"\n... and {len(found) - LIST_MAX_FILES} more files (narrow with `path` or `pattern`)"
    return shown


@env.tool(
    description=f"Search file contents with a regular expression; returns up to {GREP_MAX_MATCHES} matches as path:line: text (or, with files_only, the paths of up to {GREP_MAX_MATCHES} matching files).",
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Python syntax), e.g. \"def parse_\"."},
            "path": _PATH,
            "glob": _GLOB,
            "ignore_case": {"type": "boolean", "description": "Case-insensitive search (default false)."},
            "files_only": {"type": "boolean", "description": "Only the paths of matching files, one per line (default false)."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
)
def grep(ctx: TraceContext, pattern: str, path: str = ".", glob: str | None = None, ignore_case: bool = False, files_only: bool = False) -> str:
    root = workspace(ctx)
    start = confine(root, path)
    if not start.exists():
        raise ToolInputError(f"no such file or directory: {path!r}")
    try:
        rx = regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)
    except (regex.error, TypeError) as exc:
        raise ToolInputError(f"bad regular expression {pattern!r}: {exc}") from None
    spec = _glob(glob)
    deadline = time.monotonic() + GREP_TIME_LIMIT_S
    matches: list[str] = []
    note = ""
    try:
        for rel, match in _grep_lines(root, start, spec, rx, deadline):
            if files_only and matches and matches[-1] == rel:
                continue  # one line per file
            if len(matches) == GREP_MAX_MATCHES:
                what = "files" if files_only else "matches"
                note = f"\n(more than {GREP_MAX_MATCHES} {what}; narrow with `path`, `glob` or a longer pattern)"
                break
            matches.append(rel if files_only else match)
    except TimeoutError:
        note = f"\n(search stopped after {GREP_TIME_LIMIT_S:g}s; narrow with `path`, `glob` or a simpler pattern)"
    if not matches:
        return f"no matches for {pattern!r} under {path!r}" + note
    return "\n".join(matches) + note


@env.tool(
    description=f"Read a text file, with line numbers (at most {READ_MAX_LINES} lines per call).",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File relative to the repository root, e.g. \"src/app.py\"."},
            "start_line": {"type": "integer", "description": "First line to show (default 1)."},
            "end_line": {"type": "integer", "description": "Last line to show (default: as many as allowed)."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
)
def read_file(ctx: TraceContext, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    root = workspace(ctx)
    full = confine(root, path)
    if full.is_dir():
        raise ToolInputError(f"{path!r} is a directory; use list_files to see what it holds")
    if not full.is_file():
        raise ToolInputError(f"no such file: {path!r}")
    text = _read_text(full)
    if text is None:
        return f"({path} is binary or larger than {MAX_FILE_BYTES} bytes; not shown)"
    lines = _lines(text)
    first = max(_int(start_line, "start_line"), 1)
    if first > max(len(lines), 1):
        raise ToolInputError(f"{path} has {len(lines)} lines; start_line {first} is past the end")
    wanted = _int(end_line, "end_line") if end_line is not None else len(lines)
    if wanted < first:
        raise ToolInputError(f"end_line {wanted} is before start_line {first}")
    last = min(len(lines), wanted, first + READ_MAX_LINES - 1)
    out: list[str] = []
    size = 0
    for n in range(first, last + 1):
        row = f"{n}: {lines[n - 1]}"
        size += len(row) + 1
        if size > READ_MAX_CHARS and out:
            last = n - 1
            break
        out.append(row)
    if last < len(lines):
        out.append(f"... ({len(lines)} lines in all; continue with start_line={last + 1})")
    return "\n".join(out)


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
    paths = (_BULLET.sub("", line).strip().strip("`'\",").removeprefix("./") for line in text.splitlines())
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
    return {"score": file_f1(parse_paths(str(sample.get("output_text") or "")), list(item.get("files") or []))}


app = env.app
