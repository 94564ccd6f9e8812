"""Build a file-selection dataset from a repository's real history (stage: data).

Each kept commit becomes one row: the request is the commit message (subject and body), the
expected answer is the set of files it changed. Older commits go to `train.jsonl`, the newest
to `val.jsonl`, so evaluation is on changes the model has never seen.

Row: {"messages": [{"role": "user", "content": MESSAGE}],
      "files": [sorted paths], "repo": ABS_PATH, "commit": SHA, "parent": SHA,
      "renamed_from": {new_path: old_path}}

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from agentrft.errors import ConfigError

# Lock files and vendored code: changes to them follow from other changes (or are imports of
# someone else's code), so they are not what a request asks for. gitignore syntax.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lockb",
    "poetry.lock", "uv.lock", "Pipfile.lock", "pdm.lock", "Cargo.lock", "Gemfile.lock",
    "composer.lock", "go.sum", "mix.lock", "pubspec.lock", "Podfile.lock", "flake.lock",
    "packages.lock.json", "gradle.lockfile",
    "vendor/", "node_modules/", "third_party/", "third-party/", "_vendor/", "vendored/",
    "*.min.js", "*.min.css",
)
DEFAULT_MAX_FILES = 8
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
        raise ConfigError("git is not installed -> install git (e.g. `apt-get install git`)") from None
    if proc.returncode != 0:
        raise ConfigError(f"{repo}: `git {' '.join(args[:2])}` failed: {proc.stderr.decode(errors='replace').strip()}")
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
    args = ["log", "-z", "--name-status", "-M", "--no-relative",
            "--no-show-signature", "--no-color", "--encoding=UTF-8", f"--format={_FORMAT}"]
    if max_commits:
        args.append(f"--max-count={max_commits}")
    return parse_log(_git(repo, *args, rev, "--"))


class PathFilter:
    """Keeps a path when it matches an include (if any are given) and no exclude.
    Patterns use gitignore syntax: `docs/`, `*.lock`, `src/**/*.py`."""

    def __init__(self, include: Sequence[str] = (), exclude: Sequence[str] = (), default_excludes: bool = True) -> None:
        self.include = self._spec(include) if include else None
        self.exclude = self._spec([*(DEFAULT_EXCLUDES if default_excludes else ()), *exclude])

    @staticmethod
    def _spec(patterns: Sequence[str]) -> pathspec.PathSpec:
        for pattern in patterns:  # one at a time, to name the bad one
            try:
                pathspec.PathSpec.from_lines("gitwildmatch", [pattern])
            except ValueError as exc:
                raise ConfigError(f"path pattern {pattern!r} is not valid gitignore syntax: {exc}") from None
        return pathspec.PathSpec.from_lines("gitwildmatch", patterns)

    def keep(self, path: str) -> bool:
        if self.include is not None and not self.include.match_file(path):
            return False
        return not self.exclude.match_file(path)


def to_row(commit: Commit, repo: Path, path_filter: PathFilter, max_files: int) -> tuple[dict[str, Any] | None, str | None]:
    """The dataset row for a commit, or None and the reason it is dropped (a DROP_REASONS key)."""
    if len(commit.parents) > 1:
        return None, "merge"
    if not commit.parents:
        return None, "root_commit"
    if not commit.message:
        return None, "empty_message"
    try:
        changes = [(c.path.decode("utf-8"), c.old_path.decode("utf-8") if c.old_path else None) for c in commit.changes]
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


def split_by_time(rows: Sequence[tuple[int, dict[str, Any]]], val_fraction: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Oldest rows to train, the newest `val_fraction` to validation. `rows` holds
    (commit time, row) newest first, as git lists them; ties keep git's order. With at least
    two rows and a positive fraction, each side gets at least one."""
    oldest_first = [row for _, _, row in sorted((t, -pos, row) for pos, (t, row) in enumerate(rows))]
    n = len(oldest_first)
    n_val = round(n * val_fraction) if val_fraction > 0 else 0
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    return oldest_first[: n - n_val], oldest_first[n - n_val :]


@dataclass
class BuildReport:
    repo: Path
    seen: int = 0
    train: int = 0
    val: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    files_excluded: int = 0  # file entries removed by path filters in otherwise kept commits

    @property
    def kept(self) -> int:
        return self.train + self.val

    def lines(self) -> list[str]:
        out = [f"{self.repo}: {self.seen} commits read, {self.kept} kept ({self.train} train, {self.val} validation)"]
        for reason, text in DROP_REASONS.items():
            if self.dropped[reason]:
                out.append(f"  dropped {self.dropped[reason]:>6}  {text}")
        if self.files_excluded:
            out.append(f"  ({self.files_excluded} file entries of kept commits removed by path filters)")
        return out


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """UTF-8 stays readable; U+2028/U+2029 are escaped, as many readers split lines there."""
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            line = json.dumps(row, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
            fh.write(line + "\n")


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
        if row is None:
            report.dropped[reason or "unknown"] += 1
            continue
        report.files_excluded += len({c.path for c in commit.changes}) - len(row["files"])
        kept.append((commit.time, row))
    train, val = split_by_time(kept, val_fraction)
    report.train, report.val = len(train), len(val)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "val.jsonl", val)
    return report
