"""Build a file-selection dataset from a repository's real history (stage: data).

Each kept commit becomes one row: the request is the commit message (subject and body), the
expected answer is the set of files it changed. Older commits go to `train.jsonl`, the newest
to `val.jsonl`, so evaluation is on changes the model has never seen.

Row: {"messages": [*WORKED_EXAMPLES, {"role": "user", "content": MESSAGE}],
      "prefill": SEARCH_CALL_START, "files": [sorted paths], "repo": ABS_PATH,
      "commit": SHA, "parent": SHA, "renamed_from": {new_path: old_path}}

Worked examples (`worked_examples`, default 2) are built from this repository, never
written by hand: training commits whose subject line, given to the ranked `search` tool
(agentrft.tools.code_search), returns some of the files they changed. Each example is the
request, the search call, the search's real output at that commit, and the answer: the
numbers of the returned paths that the commit changed. Every row starts with the same
examples, and the commits they come from are taken out of the training rows.

Training commits whose subject line, searched, returns none of their files are dropped
(`keep_unfound` keeps them): no sample of theirs could score, so they only slow training
down. Validation commits are never chosen by their answer.

Each row's `prefill` (`prefill_query`, default on) starts its reply the way the examples
do, as a search for its own subject line, left open: the model may add words, then closes
the call. A 135M model left to write the whole query mostly writes noise (README of the
file-selection recipe).

Path rules: an added, modified, deleted or type-changed file counts as its path; a rename
counts as its *new* path only (the old path is kept in `renamed_from`, so a grader or report
can give credit for it, but it is not in `files`); binary files count like any other path.
Path filters apply to `files`; `max_files` is checked after them.

History is read with plain `git log -z --name-status` (no library needed); every commit that
is not kept is counted under exactly one reason, and the build reports them all.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from agentrft.data.jsonl import write_jsonl
from agentrft.errors import ConfigError
from agentrft.tools.code_search import CodeIndex, Hit, numbered

# Lock files and vendored code: changes to them follow from other changes (or are imports of
# someone else's code), so they are not what a request asks for. gitignore syntax.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "poetry.lock",
    "uv.lock",
    "Pipfile.lock",
    "pdm.lock",
    "Cargo.lock",
    "Gemfile.lock",
    "composer.lock",
    "go.sum",
    "mix.lock",
    "pubspec.lock",
    "Podfile.lock",
    "flake.lock",
    "packages.lock.json",
    "gradle.lockfile",
    "vendor/",
    "node_modules/",
    "third_party/",
    "third-party/",
    "_vendor/",
    "vendored/",
    "*.min.js",
    "*.min.css",
)
DEFAULT_MAX_FILES = 8
DEFAULT_WORKED_EXAMPLES = 2
EXAMPLE_QUERY_WORDS = 12  # a worked example searches for its subject line, cut to this many words
EXAMPLE_MAX_CHARS = 300  # only short requests become worked examples: every prompt carries them
DEFAULT_VAL_FRACTION = 0.2

# Why a commit was not kept, in the order they are checked (each commit gets the first).
DROP_REASONS = {
    "merge": "merge commit",
    "root_commit": "root commit (no parent to start from)",
    "empty_message": "empty commit message",
    "non_utf8_path": "a path is not valid UTF-8",
    "no_files": "changes no files",
    "no_files_left": "every changed file excluded by path filters",
    "too_many_files": "changes more files than --max-files",
    "nothing_to_find": "only adds files (none of its files exists before it, so no search can find one; --keep-new-only keeps them)",
    "not_found_by_search": "training commit whose subject line, searched, returns none of its files: no sample could score (--keep-unfound keeps them; validation commits are never dropped for this)",
}

_HEADER = b"\x1e"  # starts each commit's header; a status token never starts with it
_FORMAT = "%x1e%H%x00%P%x00%ct%x00%B%x00"


@dataclass(frozen=True)
class Change:
    """One file a commit touched, as `git --name-status` reports it."""

    status: str  # A C D M R T U X (renames/copies lose their similarity score)
    path: bytes  # the path after the change
    old_path: bytes | None = None  # the path before, for renames and copies


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    time: int  # committer time, seconds since the epoch
    message: str
    changes: tuple[Change, ...]


def parse_log(data: bytes) -> list[Commit]:
    """Parse `git log -z --name-status --format=_FORMAT` output, newest first as git gives it.

    With -z every field ends with NUL: `\\x1eSHA\\0PARENTS\\0TIME\\0MESSAGE\\0` then the
    status entries `STATUS\\0PATH\\0` (`R100\\0OLD\\0NEW\\0` for renames). A message cannot hold
    NUL, and status tokens are read positionally, so odd messages and paths are safe."""
    tokens = data.split(b"\0")
    commits: list[Commit] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith(_HEADER):
            i += 1  # the blank separators between header and entries, and after each commit
            continue
        sha = tok[1:].decode("ascii")
        parents = tuple(tokens[i + 1].decode("ascii").split())
        ctime = int(tokens[i + 2] or 0)
        message = tokens[i + 3].decode("utf-8", errors="replace").strip()
        i += 4
        changes: list[Change] = []
        while i < len(tokens):
            status = tokens[i].lstrip(b"\n")
            if not status:
                i += 1
                continue
            if status.startswith(_HEADER):
                break
            kind = status[:1].decode("ascii")
            if kind in ("R", "C"):
                changes.append(Change(kind, tokens[i + 2], old_path=tokens[i + 1]))
                i += 3
            else:
                changes.append(Change(kind, tokens[i + 1]))
                i += 2
        commits.append(Commit(sha, parents, ctime, message, tuple(changes)))
    return commits


def _git(repo: Path, *args: str) -> bytes:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except FileNotFoundError:
        raise ConfigError(
            "git is not installed -> install git (e.g. `apt-get install git`)"
        ) from None
    if proc.returncode != 0:
        raise ConfigError(
            f"{repo}: `git {' '.join(args[:2])}` failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout


def repo_root(repo: str | Path) -> Path:
    """The absolute top of the work tree containing `repo` (or the bare repository itself)."""
    path = Path(repo).expanduser().resolve()
    if not path.exists():
        raise ConfigError(f"{repo}: no such directory -> give the path of a local git repository")
    if _git(path, "rev-parse", "--is-bare-repository").strip() == b"true":
        return path
    return Path(_git(path, "rev-parse", "--show-toplevel").decode().strip())


def read_history(repo: Path, rev: str = "HEAD", max_commits: int | None = None) -> list[Commit]:
    """Commits reachable from `rev`, newest first. Options that user config could change
    (renames, relative paths, signatures, encoding) are pinned on the command line."""
    args = [
        "log",
        "-z",
        "--name-status",
        "-M",
        "--no-relative",
        "--no-show-signature",
        "--no-color",
        "--encoding=UTF-8",
        f"--format={_FORMAT}",
    ]
    if max_commits:
        args.append(f"--max-count={max_commits}")
    return parse_log(_git(repo, *args, rev, "--"))


class PathFilter:
    """Keeps a path when it matches an include (if any are given) and no exclude.
    Patterns use gitignore syntax: `docs/`, `*.lock`, `src/**/*.py`."""

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        default_excludes: bool = True,
    ) -> None:
        self.include = self._spec(include) if include else None
        self.exclude = self._spec([*(DEFAULT_EXCLUDES if default_excludes else ()), *exclude])

    @staticmethod
    def _spec(patterns: Sequence[str]) -> pathspec.PathSpec:
        for pattern in patterns:  # one at a time, to name the bad one
            try:
                pathspec.PathSpec.from_lines("gitwildmatch", [pattern])
            except ValueError as exc:
                raise ConfigError(
                    f"path pattern {pattern!r} is not valid gitignore syntax: {exc}"
                ) from None
        return pathspec.PathSpec.from_lines("gitwildmatch", patterns)

    def keep(self, path: str) -> bool:
        if self.include is not None and not self.include.match_file(path):
            return False
        return not self.exclude.match_file(path)


def to_row(
    commit: Commit, repo: Path, path_filter: PathFilter, max_files: int
) -> tuple[dict[str, Any] | None, str | None]:
    """The dataset row for a commit, or None and the reason it is dropped (a DROP_REASONS key)."""
    if len(commit.parents) > 1:
        return None, "merge"
    if not commit.parents:
        return None, "root_commit"
    if not commit.message:
        return None, "empty_message"
    try:
        changes = [
            (c.path.decode("utf-8"), c.old_path.decode("utf-8") if c.old_path else None)
            for c in commit.changes
        ]
    except UnicodeDecodeError:
        return None, "non_utf8_path"
    if not changes:
        return None, "no_files"
    kept = [(new, old) for new, old in changes if path_filter.keep(new)]
    files = sorted({new for new, _ in kept})
    if not files:
        return None, "no_files_left"
    if len(files) > max_files:
        return None, "too_many_files"
    renamed_from = {new: old for new, old in kept if old is not None and old != new}
    row = {
        "messages": [{"role": "user", "content": commit.message}],
        "files": files,
        "repo": str(repo),
        "commit": commit.sha,
        "parent": commit.parents[0],
        "renamed_from": renamed_from,
    }
    return row, None


def _exists_before(repo: Path, commit: Commit, files: Sequence[str]) -> bool:
    """Whether any of `files` exists in the commit's parent."""
    listed = _git(repo, "ls-tree", "-z", "--name-only", commit.parents[0], "--", *files)
    return bool(listed.strip(b"\0"))


def split_by_time(
    rows: Sequence[tuple[int, dict[str, Any]]], val_fraction: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Oldest rows to train, the newest `val_fraction` to validation. `rows` holds
    (commit time, row) newest first, as git lists them; ties keep git's order. With at least
    two rows and a positive fraction, each side gets at least one."""
    oldest_first = [
        row for _, _, row in sorted((t, -pos, row) for pos, (t, row) in enumerate(rows))
    ]
    n = len(oldest_first)
    n_val = round(n * val_fraction) if val_fraction > 0 else 0
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    return oldest_first[: n - n_val], oldest_first[n - n_val :]


def search_call(query: str) -> str:
    """The assistant text of one `search` call in agentrft's tool format."""
    return (
        "<tool_call>"
        + json.dumps({"name": "search", "arguments": {"query": query}}, ensure_ascii=False)
        + "</tool_call>"
    )


def query_prefill(message: str) -> str:
    """A row's `prefill`: its reply starts as a search for its own subject line (what the
    worked examples do), and the model goes on from there: more words, or `"}}` to search."""
    call = search_call(example_query(message))
    return call[: call.rindex('"}}')]


def example_query(message: str) -> str:
    """What a worked example searches for: the request's subject line, at most
    EXAMPLE_QUERY_WORDS words."""
    return " ".join(message.strip().splitlines()[0].split()[:EXAMPLE_QUERY_WORDS])


def subject_search(row: dict[str, Any]) -> list[Hit]:
    """What the search tool returns for the row's subject line at its parent commit."""
    return CodeIndex.from_git(row["repo"], row["parent"]).search(
        example_query(row["messages"][-1]["content"])
    )


def worked_example(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The four messages of a worked example made from `row` (request, search call, the
    search's output at the row's parent commit, answer), or None when the search returns
    none of the row's files."""
    message = row["messages"][-1]["content"]
    query = example_query(message)
    hits = subject_search(row)
    found = [n for n, h in enumerate(hits, start=1) if h.path in row["files"]]
    if not found:
        return None
    return [
        {"role": "user", "content": message},
        {"role": "assistant", "content": search_call(query)},
        {"role": "tool", "content": numbered(hits)},
        {"role": "assistant", "content": json.dumps(found)},
    ]


def pick_worked_examples(
    train: list[dict[str, Any]], n: int
) -> tuple[list[dict[str, Any]], list[int]]:
    """Up to `n` worked examples from the training rows (shortest requests first), and
    their positions in `train`."""
    messages: list[dict[str, Any]] = []
    used: list[int] = []
    answered: set[str] = set()
    order = sorted(range(len(train)), key=lambda i: (len(train[i]["messages"][-1]["content"]), i))
    for i in order:
        if len(used) == n:
            break
        if len(train[i]["messages"][-1]["content"]) > EXAMPLE_MAX_CHARS:
            continue
        example = worked_example(train[i])
        paths = set(train[i]["files"])
        if example is None or paths & answered:
            continue  # no two examples share a path, or the model learns to repeat it
        answered.update(paths)
        messages += example
        used.append(i)
    return messages, used


@dataclass
class BuildReport:
    repo: Path
    seen: int = 0
    train: int = 0
    val: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    files_excluded: int = 0  # file entries removed by path filters in otherwise kept commits
    examples: list[str] = field(default_factory=list)  # commits turned into worked examples

    @property
    def kept(self) -> int:
        return self.train + self.val

    def lines(self) -> list[str]:
        out = [
            f"{self.repo}: {self.seen} commits read, {self.kept} kept ({self.train} train, {self.val} validation)"
        ]
        for reason, text in DROP_REASONS.items():
            if self.dropped[reason]:
                out.append(f"  dropped {self.dropped[reason]:>6}  {text}")
        if self.files_excluded:
            out.append(
                f"  ({self.files_excluded} file entries of kept commits removed by path filters)"
            )
        if self.examples:
            out.append(
                f"  {len(self.examples)} training commits became the worked examples at the start of every row: {', '.join(c[:10] for c in self.examples)}"
            )
        return out


def build_dataset(
    repo: str | Path,
    out_dir: str | Path,
    *,
    rev: str = "HEAD",
    max_commits: int | None = None,
    max_files: int = DEFAULT_MAX_FILES,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_excludes: bool = True,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    worked_examples: int = DEFAULT_WORKED_EXAMPLES,
    keep_new_only: bool = False,
    prefill_query: bool = True,
    keep_unfound: bool = False,
) -> BuildReport:
    """Read `repo`'s history from `rev`, write `out_dir/train.jsonl` and `out_dir/val.jsonl`,
    and return counts of what was kept and why the rest was dropped."""
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if max_files < 1:
        raise ConfigError(f"max_files must be at least 1, got {max_files}")
    root = repo_root(repo)
    path_filter = PathFilter(include, exclude, default_excludes)
    report = BuildReport(root)
    kept: list[tuple[int, dict[str, Any]]] = []
    for commit in read_history(root, rev, max_commits):
        report.seen += 1
        row, reason = to_row(commit, root, path_filter, max_files)
        if row is not None and not keep_new_only and not _exists_before(root, commit, row["files"]):
            row, reason = None, "nothing_to_find"
        if row is None:
            report.dropped[reason or "unknown"] += 1
            continue
        report.files_excluded += len({c.path for c in commit.changes}) - len(row["files"])
        kept.append((commit.time, row))
    train, val = split_by_time(kept, val_fraction)
    if not keep_unfound:  # training rows only: held-out rows are never chosen by their answer
        findable = [
            row for row in train if {h.path for h in subject_search(row)} & set(row["files"])
        ]
        report.dropped["not_found_by_search"] += len(train) - len(findable)
        train = findable
    if worked_examples > 0:
        examples, used = pick_worked_examples(train, worked_examples)
        report.examples = [train[i]["commit"] for i in used]
        train = [row for i, row in enumerate(train) if i not in used]
        for row in [*train, *val]:
            row["messages"] = [*examples, *row["messages"]]
    if prefill_query:
        for row in [*train, *val]:
            row["prefill"] = query_prefill(row["messages"][-1]["content"])
    report.train, report.val = len(train), len(val)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "val.jsonl", val)
    return report
