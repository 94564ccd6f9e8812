"""A repository, as one rollout sees it: a per-trace workspace of one commit and the tools
that read it (search, list_files, grep, read_file). Shared by the recipes whose model
researches a repository (file selection, repository research); each registers the tools on
its own `ToolServer` with `register_repo_tools`, or wraps the `*_in` functions itself.

Workspace: the commit exported with `git archive | tar -x` into a fresh temporary directory
on the rollout's first tool call, deleted on cleanup. `git archive` only reads the
repository, so concurrent rollouts never contend on it, and the workspace holds no `.git`:
other commits cannot leak through history. Workspaces go under $AGENTRFT_WORKSPACE_DIR
(default: the system temp directory).

Every path is relative to the repository root and confined to the workspace: `..`, absolute
paths and symlinks leading outside are refused with ToolInputError (a 400 the model reads).
The `*_in` functions take their limits as arguments, so an environment can set its own.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec
import regex

from agentrft.tools.code_search import DEFAULT_TOP_K, CodeIndex, numbered
from agentrft.tools.envkit import ToolInputError, ToolServer, TraceContext, bad_path

LIST_MAX_FILES = 100
GREP_MAX_MATCHES = 20
GREP_TIME_LIMIT_S = 10.0
READ_MAX_LINES = 60
READ_MAX_CHARS = 16_000
LINE_MAX_CHARS = 120  # grep shows at most this much of a matching line
MAX_FILE_BYTES = 1 << 20  # grep and read_file skip larger files
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


# -- workspaces -----------------------------------------------------------------------------
def check_revision(repo: str, commit: str, field: str = "parent") -> None:
    """RuntimeError (the environment's fault, a 500) unless `commit` looks like a commit hash
    and `repo` is a directory here."""
    if not _SHA.match(commit or ""):
        raise RuntimeError(f"item field `{field}` must be a commit hash, got {commit!r}")
    if not repo or not Path(repo).is_dir():
        raise RuntimeError(
            f"item field `repo` is not a directory on the environment's machine: {repo!r}"
        )


def create_workspace(repo: str, commit: str, label: str = "", field: str = "parent") -> Path:
    """Export `commit` of `repo` into a new directory and return its resolved path."""
    check_revision(repo, commit, field)
    base = os.environ.get("AGENTRFT_WORKSPACE_DIR") or None
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", label)[:64]
    root = Path(tempfile.mkdtemp(prefix=f"agentrft-ws-{safe}-", dir=base)).resolve()
    try:
        archive = subprocess.Popen(
            ["git", "-C", repo, "archive", "--format=tar", commit],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        tar = subprocess.run(
            ["tar", "-x", "-C", str(root)], stdin=archive.stdout, capture_output=True
        )
        assert archive.stdout is not None and archive.stderr is not None
        archive.stdout.close()
        err = archive.stderr.read()
        if archive.wait() != 0 or tar.returncode != 0:
            raise RuntimeError(
                f"cannot export {commit} of {repo}: {(err or tar.stderr).decode(errors='replace').strip()}"
            )
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def trace_workspace(ctx: TraceContext, field: str = "parent") -> Path:
    """The rollout's workspace of the commit in item field `field`, created by its first tool
    call. Grading needs none, so a rollout that answers without reading files never pays for
    a checkout."""
    with ctx.lock:  # parallel calls of one turn share one workspace; cleanup takes it too
        if ctx.state.get("closed"):
            raise RuntimeError(f"trace {ctx.trace_id} was already cleaned up")
        if "root" not in ctx.state:
            ctx.state["root"] = create_workspace(
                str(ctx.item.get("repo") or ""), str(ctx.item.get(field) or ""), ctx.trace_id, field
            )
        root: Path = ctx.state["root"]
        return root


def remove_workspace(ctx: TraceContext) -> None:
    """The `on_cleanup` hook: delete the rollout's workspace, and refuse tools after it."""
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
        raise ToolInputError(
            f'{path!r} is absolute; paths are relative to the repository root, e.g. "src/app.py"'
        )
    if ".." in rel.parts:
        raise ToolInputError(f"{path!r} contains `..`; paths stay inside the repository")
    try:
        full = (root / rel).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long: the model's to fix
        if bad_path(exc) is None:
            raise
        raise ToolInputError(
            f"{path!r} cannot be followed (a symbolic link loop, or too long); try another path"
        ) from None
    if not full.is_relative_to(root):
        raise ToolInputError(f"{path!r} points outside the repository")
    return full


def glob_spec(pattern: str | None) -> pathspec.PathSpec | None:
    """A glob in gitignore syntax ("*.py" matches at any depth), or ToolInputError."""
    if not pattern:
        return None
    try:
        return pathspec.PathSpec.from_lines("gitwildmatch", [pattern])
    except (ValueError, TypeError) as exc:
        raise ToolInputError(f"bad glob {pattern!r}: {exc}") from None


def iter_files(
    root: Path, start: Path, spec: pathspec.PathSpec | None
) -> Iterator[tuple[str, Path]]:
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
            if spec is None or spec.match_file(
                full.relative_to(start if start.is_dir() else start.parent).as_posix()
            ):
                yield full.relative_to(root).as_posix(), full


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ToolInputError(f"`{name}` must be an integer, got {value!r}") from None


def read_text(full: Path, max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """The file's text with CRLF as LF, or None when it is binary or too large."""
    if full.stat().st_size > max_bytes:
        return None
    data = full.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


def split_lines(text: str) -> list[str]:
    """Lines as git and grep count them (split at LF only), so grep's line numbers are
    read_file's line numbers even in files holding form feeds or other separators."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


# Constructs that can match within one line but not at the same place in the whole file.
_LINE_ONLY = re.compile(r"\\[AZzG]|\(\?<?[=!]")


def grep_lines(
    root: Path,
    start: Path,
    spec: pathspec.PathSpec | None,
    rx: Any,
    deadline: float,
    line_max_chars: int = LINE_MAX_CHARS,
    max_bytes: int = MAX_FILE_BYTES,
) -> Iterator[tuple[str, str]]:
    """(path, "path:line: text") for each matching line of the text files under `start`; raises
    TimeoutError once `deadline` (time.monotonic) passes, even inside one slow match.
    A file is first searched whole (one C-level scan; measured 5x faster when nothing matches):
    with MULTILINE and without the constructs of _LINE_ONLY, every line match is also a
    whole-file match, so a file without one is skipped without changing the result."""
    whole = (
        None
        if _LINE_ONLY.search(rx.pattern)
        else regex.compile(rx.pattern, rx.flags | regex.MULTILINE)
    )

    def left() -> float:
        return max(deadline - time.monotonic(), 0.001)

    for rel, full in iter_files(root, start, spec):
        if not full.is_file() or not full.resolve().is_relative_to(root):
            continue  # a broken symlink, or one leading outside the workspace
        text = read_text(full, max_bytes)
        if text is None or (whole is not None and not whole.search(text, timeout=left())):
            continue
        for lineno, line in enumerate(split_lines(text), start=1):
            if rx.search(line, timeout=left()):
                yield rel, f"{rel}:{lineno}: {line.strip()[:line_max_chars]}"


# -- the tools' work, on a workspace --------------------------------------------------------
def list_files_in(
    root: Path, path: str = ".", pattern: str | None = None, *, max_files: int = LIST_MAX_FILES
) -> str:
    start = confine(root, path)
    if not start.exists():
        raise ToolInputError(f"no such directory: {path!r}")
    found = [rel for rel, _ in iter_files(root, start, glob_spec(pattern))]
    if not found:
        return f"no files under {path!r}" + (f" matching {pattern!r}" if pattern else "")
    shown = "\n".join(found[:max_files])
    if len(found) > max_files:
        shown += f"\n... and {len(found) - max_files} more files (narrow with `path` or `pattern`)"
    return shown


def grep_in(
    root: Path,
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    ignore_case: bool = False,
    files_only: bool = False,
    *,
    max_matches: int = GREP_MAX_MATCHES,
    time_limit_s: float = GREP_TIME_LIMIT_S,
    line_max_chars: int = LINE_MAX_CHARS,
    max_bytes: int = MAX_FILE_BYTES,
) -> str:
    start = confine(root, path)
    if not start.exists():
        raise ToolInputError(f"no such file or directory: {path!r}")
    try:
        rx = regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)
    except (regex.error, TypeError) as exc:
        raise ToolInputError(f"bad regular expression {pattern!r}: {exc}") from None
    spec = glob_spec(glob)
    deadline = time.monotonic() + time_limit_s
    matches: list[str] = []
    note = ""
    try:
        for rel, match in grep_lines(root, start, spec, rx, deadline, line_max_chars, max_bytes):
            if files_only and matches and matches[-1] == rel:
                continue  # one line per file
            if len(matches) == max_matches:
                what = "files" if files_only else "matches"
                note = f"\n(more than {max_matches} {what}; narrow with `path`, `glob` or a longer pattern)"
                break
            matches.append(rel if files_only else match)
    except TimeoutError:
        note = f"\n(search stopped after {time_limit_s:g}s; narrow with `path`, `glob` or a simpler pattern)"
    if not matches:
        return f"no matches for {pattern!r} under {path!r}" + note
    return "\n".join(matches) + note


def read_file_in(
    root: Path,
    path: str,
    start_line: int = 1,
    end_line: int | None = None,
    *,
    max_lines: int = READ_MAX_LINES,
    max_chars: int = READ_MAX_CHARS,
    max_bytes: int = MAX_FILE_BYTES,
) -> str:
    full = confine(root, path)
    if full.is_dir():
        raise ToolInputError(f"{path!r} is a directory; use list_files to see what it holds")
    if not full.is_file():
        raise ToolInputError(f"no such file: {path!r}")
    text = read_text(full, max_bytes)
    if text is None:
        return f"({path} is binary or larger than {max_bytes} bytes; not shown)"
    lines = split_lines(text)
    first = max(_int(start_line, "start_line"), 1)
    if first > max(len(lines), 1):
        raise ToolInputError(f"{path} has {len(lines)} lines; start_line {first} is past the end")
    wanted = _int(end_line, "end_line") if end_line is not None else len(lines)
    if wanted < first:
        raise ToolInputError(f"end_line {wanted} is before start_line {first}")
    last = min(len(lines), wanted, first + max_lines - 1)
    out: list[str] = []
    size = 0
    for n in range(first, last + 1):
        row = f"{n}: {lines[n - 1]}"
        size += len(row) + 1
        if size > max_chars and out:
            last = n - 1
            break
        out.append(row)
    if last < len(lines):
        out.append(f"... ({len(lines)} lines in all; continue with start_line={last + 1})")
    return "\n".join(out)


# -- ranked search: one index per revision, read from git ------------------------------------
_index_lock = threading.Lock()
_building: dict[tuple[str, str], threading.Lock] = {}


@functools.lru_cache(maxsize=16)
def _built_index(repo: str, commit: str) -> CodeIndex:
    return CodeIndex.from_git(repo, commit)


def revision_index(repo: str, commit: str, field: str = "parent") -> CodeIndex:
    """One search index per revision, shared by every rollout on it (read from git: the
    rollout's workspace is not needed, and the index cannot see other revisions). The
    rollouts of a group search the same revision at once: one builds it, the rest wait."""
    check_revision(repo, commit, field)
    with _index_lock:
        lock = _building.setdefault((repo, commit), threading.Lock())
    with lock:
        return _built_index(repo, commit)


def search_in(repo: str, commit: str, query: str, field: str = "parent") -> str:
    if not isinstance(query, str) or not query.strip():
        raise ToolInputError('`query` must be a non-empty string of words, e.g. "parse commit log"')
    hits = revision_index(repo, commit, field).search(query)
    if not hits:
        return f"no files match {query!r}; try other words"
    return numbered(hits)


# -- the tools' names, descriptions and schemas ----------------------------------------------
SEARCH_DESCRIPTION = f"Ranked search over the repository's file paths, names and text; returns the {DEFAULT_TOP_K} best-matching files, best first, one numbered line each: N. path  (matches: words)."
SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": 'Words to look for, e.g. "parse commit log"; any wording works.',
        }
    },
    "required": ["query"],
    "additionalProperties": False,
}
_PATH = {
    "type": "string",
    "description": "Directory or file relative to the repository root (default: the root).",
}
_GLOB = {
    "type": "string",
    "description": 'Only files matching this glob (relative to `path`), e.g. "*.py" or "tests/**/test_*.py".',
}
LIST_FILES_DESCRIPTION = f"List the repository's files (at most {LIST_MAX_FILES}), optionally under a directory and matching a glob."
LIST_FILES_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"path": _PATH, "pattern": _GLOB},
    "additionalProperties": False,
}
GREP_DESCRIPTION = f"Search file contents with a regular expression; returns up to {GREP_MAX_MATCHES} matches as path:line: text (or, with files_only, the paths of up to {GREP_MAX_MATCHES} matching files)."
GREP_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": 'Regular expression (Python syntax), e.g. "def parse_".',
        },
        "path": _PATH,
        "glob": _GLOB,
        "ignore_case": {
            "type": "boolean",
            "description": "Case-insensitive search (default false).",
        },
        "files_only": {
            "type": "boolean",
            "description": "Only the paths of matching files, one per line (default false).",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}
READ_FILE_DESCRIPTION = (
    f"Read a text file, with line numbers (at most {READ_MAX_LINES} lines per call)."
)
READ_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": 'File relative to the repository root, e.g. "src/app.py".',
        },
        "start_line": {"type": "integer", "description": "First line to show (default 1)."},
        "end_line": {
            "type": "integer",
            "description": "Last line to show (default: as many as allowed).",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


def register_repo_tools(
    env: ToolServer,
    field: str = "commit",
    names: tuple[str, ...] = ("search", "list_files", "grep", "read_file"),
) -> dict[str, Callable[..., str]]:
    """Serve `names` (of search, list_files, grep, read_file) on `env` over the repository at
    the commit in item field `field` (and item field `repo`), with a workspace per trace
    removed on cleanup. Returns the registered tool functions by name. The tools read this
    module's limits at each call, so a test can lower one for a while."""

    def search(ctx: TraceContext, query: str) -> str:
        return search_in(
            str(ctx.item.get("repo") or ""), str(ctx.item.get(field) or ""), query, field
        )

    def list_files(ctx: TraceContext, path: str = ".", pattern: str | None = None) -> str:
        return list_files_in(trace_workspace(ctx, field), path, pattern, max_files=LIST_MAX_FILES)

    def grep(
        ctx: TraceContext,
        pattern: str,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        files_only: bool = False,
    ) -> str:
        return grep_in(
            trace_workspace(ctx, field),
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

    def read_file(
        ctx: TraceContext, path: str, start_line: int = 1, end_line: int | None = None
    ) -> str:
        return read_file_in(
            trace_workspace(ctx, field),
            path,
            start_line,
            end_line,
            max_lines=READ_MAX_LINES,
            max_chars=READ_MAX_CHARS,
            max_bytes=MAX_FILE_BYTES,
        )

    tools: dict[str, tuple[Callable[..., str], str, dict[str, Any]]] = {
        "search": (search, SEARCH_DESCRIPTION, SEARCH_PARAMETERS),
        "list_files": (list_files, LIST_FILES_DESCRIPTION, LIST_FILES_PARAMETERS),
        "grep": (grep, GREP_DESCRIPTION, GREP_PARAMETERS),
        "read_file": (read_file, READ_FILE_DESCRIPTION, READ_FILE_PARAMETERS),
    }
    unknown = set(names) - set(tools)
    if unknown:
        raise ValueError(f"no repository tool named {sorted(unknown)}; there are {sorted(tools)}")
    for name in names:
        fn, description, parameters = tools[name]
        env.tool(fn, name=name, description=description, parameters=parameters)
    env.on_cleanup(remove_workspace)
    return {name: tools[name][0] for name in names}
