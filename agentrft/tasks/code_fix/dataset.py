"""Build a code-fix dataset from a Python project and its own tests (stage: data).

A bug is injected mechanically into a function of the project, with Python's `ast`, and kept
only where it makes a test fail: the tests run in `agentrft.sandbox` once on the clean
revision (all must pass) and once per injected bug (at least one must fail). Each kept bug
is one row: the request is the failing test's name and output, the answer is code that
passes the tests again.

Row: {"messages": [{"role": "user", "content": REQUEST}], "repo": ABS_PATH, "commit": SHA,
      "files": [path], "patch": BUG_DIFF, "tests": [test files], "shown_test": NODE_ID,
      "failing": [node ids], "passing_clean": N, "test_command": "python -m pytest ...",
      "mutation": {"kind", "function", "line", "before", "after"}, ["prefill": ...]}

`patch` (a unified diff that injects the bug; its reverse is the minimal fix) and `failing`
(every test the bug breaks; the model is shown only `shown_test`, the others are held back so
a special case on the shown test's inputs does not pass) are for the environment and its
grader, never for the model.

Bugs (`KINDS`), each on a single line: a flipped comparison (`<` -> `>=`, `==` -> `!=`,
`in` -> `not in`, `is` -> `is not`), an off-by-one (an integer constant + 1), a wrong
operator (`+` <-> `-`, `*` <-> `/`, `//` -> `/`, `and` <-> `or`) and a dropped `not`.
The source text is edited at the operator, so the diff is one line.

Train and validation are split by source file: held-out rows are about code no training row
touches. Every injected bug that is not kept is counted under one reason (`DROP_REASONS`).

`hint`: "none" (the failing test only), "function" (plus the buggy function's source), or
"line" (plus a prefill that starts the edit call on the buggy line: it gives the location
away), or "repair" (plus what the repair tools of repair.py say about the buggy tree: the
suspicious lines by fault localization and numbered fix candidates; computed from the tree and
its tests, never from the row's answer).

`source` may be a git repository, or a directory without `.git` or a Python sdist
(`.tar.gz`, `.zip`; e.g. `pip download --no-deps --no-binary :all: NAME==VERSION`): those are
snapshotted into a local git repository first (source.py), so that every workspace is a
`git archive` of one commit.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import difflib
import hashlib
import json
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from agentrft.data.jsonl import write_jsonl
from agentrft.errors import ConfigError
from agentrft.sandbox import Limits, run_sandboxed
from agentrft.tasks.code_fix.source import DEFAULT_TEST_COMMAND, resolve_source

KINDS = ("flip_comparison", "off_by_one", "wrong_operator", "drop_negation")
HINTS = ("none", "function", "line", "repair")
DEFAULT_TESTS = ("tests/**/test_*.py", "tests/**/*_test.py")
DEFAULT_VAL_FRACTION = 0.34
DEFAULT_MAX_PER_FILE = 6
DEFAULT_MAX_PER_FUNCTION = 1
TEST_LIMITS = Limits(cpu_s=60, wall_s=120.0, memory_mb=2048)
OUTPUT_MAX_CHARS = 1200  # of a failing test's output, in the request and in run_tests
REPAIR_OUTPUT_CHARS = 400  # of it in the repair variant's request (the lists need the room)

# Why an injected bug was not kept (each gets the first that applies).
DROP_REASONS = {
    "not_caught": "every covering test still passes with the bug (the tests do not see it)",
    "collection_error": "the bug breaks collecting the tests (an import error), not a test",
    "timeout": "the test run hit the time limit with the bug (e.g. an endless loop)",
    "too_few_failing": "fewer tests fail than --min-failing (nothing to hold back)",
}
# Files that decide how tests run: a rollout's edits to them never count (see `graded_tree`).
CONFIG_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "pytest.ini", "tox.ini", "noxfile.py")

_CMP_FLIP = {
    ast.Eq: (ast.NotEq, r"=="),
    ast.NotEq: (ast.Eq, r"!="),
    ast.Lt: (ast.GtE, r"<(?!=)"),
    ast.GtE: (ast.Lt, r">="),
    ast.Gt: (ast.LtE, r">(?!=)"),
    ast.LtE: (ast.Gt, r"<="),
    ast.In: (ast.NotIn, r"\bin\b"),
    ast.NotIn: (ast.In, r"\bnot\s+in\b"),
    ast.Is: (ast.IsNot, r"\bis\b(?!\s+not\b)"),
    ast.IsNot: (ast.Is, r"\bis\s+not\b"),
}
_OP_TEXT = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.GtE: ">=",
    ast.Gt: ">",
    ast.LtE: "<=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_BIN_SWAP = {
    ast.Add: (r"\+", "-"),
    ast.Sub: (r"-", "+"),
    ast.Mult: (r"\*(?!\*)", "/"),
    ast.Div: (r"(?<!/)/(?!/)", "*"),
    ast.FloorDiv: (r"//", "/"),
}
_BOOL_SWAP = {ast.And: (r"\band\b", "or"), ast.Or: (r"\bor\b", "and")}


# -- bug injection ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutation:
    """One single-line bug in one function of one file."""

    path: str
    function: str  # qualified name, e.g. "Formula._parse"
    kind: str
    line: int  # 1-based
    before: str  # the line as it was
    after: str  # the line with the bug
    source: str  # the whole file with the bug

    def patch(self, original: str) -> str:
        """The unified diff (git-style paths) that injects the bug into `original`."""
        return "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                self.source.splitlines(keepends=True),
                f"a/{self.path}",
                f"b/{self.path}",
            )
        )


def segment_edit(line: str, start: int, end: int, pattern: str, repl: str) -> str | None:
    """`line` with the first match of `pattern` between byte columns start..end replaced."""
    raw = line.encode()
    gap = raw[start:end].decode(errors="strict")
    m = re.search(pattern, gap)
    if m is None:
        return None
    new_gap = gap[: m.start()] + repl + gap[m.end() :]
    return (raw[:start] + new_gap.encode() + raw[end:]).decode()


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones too."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _own_nodes(fn: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(node, parent) inside `fn`'s body, not inside functions or classes nested in it."""
    stack: list[tuple[ast.AST, ast.AST]] = [
        (c, fn) for c in getattr(fn, "body", []) if not isinstance(c, ast.Expr | ast.Pass)
    ]
    while stack:
        node, parent = stack.pop()
        if isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda | ast.JoinedStr
        ):
            continue  # nested code has its own name; an f-string's inside is text first
        yield node, parent
        stack.extend((c, node) for c in ast.iter_child_nodes(node))


def bug_edits(node: ast.AST, parent: ast.AST, line: str) -> Iterator[tuple[str, str]]:
    """(kind, new line) for each bug this node can carry; the node sits on `line` alone."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        flip = _CMP_FLIP.get(type(node.ops[0]))
        if flip is not None:
            new = segment_edit(
                line,
                node.left.end_col_offset or 0,
                node.comparators[0].col_offset,
                flip[1],
                _OP_TEXT[flip[0]],
            )
            if new is not None:
                yield "flip_comparison", new
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
        pattern, repl = _BIN_SWAP[type(node.op)]
        new = segment_edit(
            line, node.left.end_col_offset or 0, node.right.col_offset, pattern, repl
        )
        if new is not None:
            yield "wrong_operator", new
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        pattern, repl = _BOOL_SWAP[type(node.op)]
        new = segment_edit(
            line, node.values[0].end_col_offset or 0, node.values[1].col_offset, pattern, repl
        )
        if new is not None:
            yield "wrong_operator", new
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        new = segment_edit(line, node.col_offset, node.operand.col_offset, r"not\s*", "")
        if new is not None:
            yield "drop_negation", new
    elif (
        isinstance(node, ast.Constant)
        and type(node.value) is int
        and isinstance(parent, ast.Compare | ast.Slice | ast.Subscript | ast.BinOp | ast.Call)
    ):
        raw = line.encode()
        start, end = node.col_offset, node.end_col_offset or 0
        if raw[start:end].decode().isdigit():
            yield "off_by_one", (raw[:start] + str(node.value + 1).encode() + raw[end:]).decode()


def mutations(source: str, path: str, kinds: Sequence[str] = KINDS) -> list[Mutation]:
    """Every single-line bug of `kinds` that can be injected into the functions of `source`,
    in source order. Each is checked to parse and to change the program."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found: list[Mutation] = []
    seen: set[tuple[int, str]] = set()
    original_dump = ast.dump(tree)
    for name, fn in _functions(tree):
        for node, parent in _own_nodes(fn):
            lineno = getattr(node, "lineno", None)
            if lineno is None or getattr(node, "end_lineno", None) != lineno:
                continue
            line = lines[lineno - 1]
            for kind, new_line in bug_edits(node, parent, line):
                if kind not in kinds or new_line == line or (lineno, new_line) in seen:
                    continue
                text = "".join([*lines[: lineno - 1], new_line, *lines[lineno:]])
                try:
                    changed = ast.dump(ast.parse(text)) != original_dump
                except SyntaxError:
                    continue
                if changed:
                    seen.add((lineno, new_line))
                    found.append(
                        Mutation(
                            path, name, kind, lineno, line.rstrip("\n"), new_line.rstrip("\n"), text
                        )
                    )
    return sorted(found, key=lambda m: (m.line, m.kind, m.after))


def choose(
    found: Sequence[Mutation], max_per_file: int, max_per_function: int, seed: int
) -> list[Mutation]:
    """A spread of `found`: kinds taken in turn, at most `max_per_function` per function and
    `max_per_file` in all, in a seeded order (the same seed picks the same bugs)."""
    rng = random.Random(f"{seed}:{found[0].path}" if found else seed)
    by_kind: dict[str, list[Mutation]] = {}
    for m in found:
        by_kind.setdefault(m.kind, []).append(m)
    for group in by_kind.values():
        rng.shuffle(group)
    picked: list[Mutation] = []
    per_function: Counter[str] = Counter()
    queues = [by_kind[k] for k in KINDS if k in by_kind]
    while any(queues) and len(picked) < max_per_file:
        for queue in queues:
            while queue:
                m = queue.pop()
                if per_function[m.function] < max_per_function:
                    per_function[m.function] += 1
                    picked.append(m)
                    break
            if len(picked) >= max_per_file:
                break
    return picked


# -- running the tests, in the sandbox -------------------------------------------------------
@dataclass(frozen=True)
class TestRun:
    """One sandboxed pytest run: the verdict per test node id, and what it printed."""

    returncode: int | None
    outcomes: dict[str, str]  # node id -> passed | failed | error | skipped
    details: dict[str, str]  # node id -> failure text (failed and error only)
    output: str  # the tail of stdout and stderr
    timed_out: bool
    wall_s: float
    files: dict[str, bytes] = field(default_factory=dict)  # run_tests(read_back=...)

    @property
    def passed(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o == "passed"]

    @property
    def broken(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o in ("failed", "error")]


def command_argv(command: str) -> list[str]:
    """The test command as an argv; a leading `python` is this interpreter (its packages)."""
    argv = shlex.split(command)
    if not argv:
        raise ConfigError("the test command is empty; e.g. --test-command 'python -m pytest -q'")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _node_id(case: ET.Element) -> str:
    """pytest's node id from a junit (xunit1) testcase: file::[Class::]name."""
    file = case.get("file") or ""
    classname = case.get("classname") or ""
    module = file.removesuffix(".py").replace("/", ".")
    inner = classname.removeprefix(module).lstrip(".")
    return "::".join(p for p in (file, inner.replace(".", "::"), case.get("name") or "") if p)


def parse_junit(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(outcome per node id, failure text per node id) from pytest's junit XML."""
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}
    for case in ET.fromstring(text).iter("testcase"):
        node = _node_id(case)
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                if tag != "skipped":
                    details[node] = (child.text or child.get("message") or "").strip()
                break
        outcomes[node] = outcome
    return outcomes, details


def run_tests(
    root: Path,
    selectors: Sequence[str],
    command: str,
    limits: Limits = TEST_LIMITS,
    *,
    extra_files: dict[str, str] | None = None,
    read_back: Sequence[str] = (),
) -> TestRun:
    """Run `command selectors...` on a copy of the tree `root` inside the sandbox (no
    network, the limits above) and read each test's verdict from a junit report. The copy
    keeps `root` as it was, whatever the tests write. `extra_files` are written into the copy
    first (e.g. a coverage configuration); `read_back` names files of the copy whose bytes
    come back in `TestRun.files` (those that exist)."""
    argv = command_argv(command)
    with tempfile.TemporaryDirectory(prefix="agentrft-tests-") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(root, work, symlinks=True)
        for rel, text in (extra_files or {}).items():
            (work / rel).write_text(text)
        report = f".agentrft-junit-{hashlib.sha1(tmp.encode()).hexdigest()[:12]}.xml"
        argv += [*selectors, f"--junitxml={report}", "-o", "junit_family=xunit1"]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(work),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
        }
        res = asyncio.run(run_sandboxed(argv, work, limits, env=env))
        outcomes: dict[str, str] = {}
        details: dict[str, str] = {}
        junit = work / report
        if junit.is_file():
            with contextlib.suppress(ET.ParseError):  # a broken report: no verdicts
                outcomes, details = parse_junit(junit.read_text(errors="replace"))
        files = {rel: (work / rel).read_bytes() for rel in read_back if (work / rel).is_file()}
    output = (res.stdout + ("\n" + res.stderr if res.stderr.strip() else "")).strip()
    return TestRun(res.returncode, outcomes, details, output, res.timed_out, res.wall_s, files)


# -- which tests cover which file -------------------------------------------------------------
def module_names(path: str) -> set[str]:
    """The import names of a source file: `pkg/mod.py` -> pkg.mod (and without `src/`)."""
    dotted = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    names = {dotted}
    if dotted.startswith("src."):
        names.add(dotted.removeprefix("src."))
    return names


def imported_modules(source: str) -> set[str]:
    """Every module a file imports, with `from pkg import name` also counted as pkg.name."""
    out: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


# -- the dataset -----------------------------------------------------------------------------
@dataclass
class BuildReport:
    train: int = 0
    val: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # per source file
    dropped: Counter[str] = field(default_factory=Counter)
    kept_kinds: Counter[str] = field(default_factory=Counter)
    commit: str = ""

    @property
    def kept(self) -> int:
        return self.train + self.val

    def lines(self) -> list[str]:
        out = [f"revision {self.commit}"]
        for path, info in self.files.items():
            out.append(f"  {path}: {info['status']}")
        tried = self.kept + sum(self.dropped.values())
        out.append(f"injected {tried} bugs, kept {self.kept} ({self.train} train / {self.val} val)")
        if self.kept_kinds:
            out.append(
                "kept by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(self.kept_kinds.items()))
            )
        for reason, n in self.dropped.most_common():
            out.append(f"dropped {n}: {reason} ({DROP_REASONS[reason]})")
        return out


def _resolve(repo: Path, rev: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ConfigError(
            f"{repo}: {rev!r} is not a commit here ({proc.stderr.strip()}); pass --rev with a branch, tag or commit of this repository"
        )
    return proc.stdout.strip()


def request(row: dict[str, Any], hint: str, source: str) -> str:
    """The row's request: the failing test and its output, and with `hint` "function" or
    "line" the buggy function (from `source`, the file with the bug) with line numbers."""
    m = row["mutation"]
    path = row["files"][0]
    parts = [f"The test `{row['shown_test']}` fails:\n```\n{row['shown_output']}\n```"]
    if hint in ("function", "line"):
        fn = next(n for name, n in _functions(ast.parse(source)) if name == m["function"])
        lines = source.splitlines()
        first, last = fn.lineno, fn.end_lineno or fn.lineno  # type: ignore[attr-defined]
        shown = "\n".join(f"{n}: {lines[n - 1]}" for n in range(first, last + 1))
        parts.append(f"The code under test, `{m['function']}` in {path}:\n```\n{shown}\n```")
    parts.append(f"Fix the bug in {path} (not the test) so that the tests pass.")
    return "\n\n".join(parts)


def apply_patch(root: Path, patch: str) -> None:
    """Apply a row's bug (a unified diff with a/ b/ paths) to the tree at `root`."""
    if not patch:
        raise RuntimeError("item field `patch` is empty: the row carries no bug")
    proc = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", "-"],
        cwd=root,
        input=patch,
        text=True,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the row's patch does not apply: {proc.stderr.strip()[:300]}")


def repair_request(row: dict[str, Any], buggy: Path) -> tuple[str, int | None, dict[str, Any]]:
    """The repair variant's request: the failing test, then what the repair tools say about
    the tree `buggy` (the suspicious lines and the numbered candidates; see repair.py). And
    the number of the candidate that undoes the row's bug (None when the list lacks it):
    where the answer lands in the list, for the row's `fix_candidate` (other candidates may
    pass the tests too). And the localization, for the row's `localization`: the
    environment's first apply reuses it rather than run the tests with coverage again."""
    from agentrft.tasks.code_fix import repair  # repair builds on this module's test runs

    suspects = repair.localize(buggy, row["tests"], row["test_command"])
    candidates = repair.candidate_list(buggy, suspects)
    m = row["mutation"]
    fix = next(
        (
            c.number
            for c in candidates
            if (c.path, c.line) == (row["files"][0], m["line"])
            and c.after.rstrip() == m["before"].rstrip()
        ),
        None,
    )
    output = row["shown_output"][-REPAIR_OUTPUT_CHARS:]
    text = (
        f"The test `{row['shown_test']}` fails:\n```\n{output}\n```\n\n"
        f"{repair.render(suspects, candidates)}\n\n"
        "Apply the candidate that fixes the bug, then reply with one short sentence."
    )
    return text, fix, repair.stored(buggy, suspects)


def hinted(row: dict[str, Any], hint: str) -> dict[str, Any]:
    """The same row with the request (and prefill) of another `hint` level; the bug's file
    is read from the row's repository at its commit."""
    if hint not in HINTS:
        raise ConfigError(f"hint {hint!r} is not one of {', '.join(HINTS)}")
    if hint == "repair":
        from agentrft.tools.repo_workspace import create_workspace

        tree = create_workspace(str(row["repo"]), str(row["commit"]), "code-fix-hint", "commit")
        try:
            apply_patch(tree, str(row["patch"]))
            text, fix, localization = repair_request(row, tree)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        out = {k: v for k, v in row.items() if k != "prefill"}
        out["messages"] = [{"role": "user", "content": text}]
        out["fix_candidate"] = fix
        out["localization"] = localization
        return out
    m, path = row["mutation"], row["files"][0]
    proc = subprocess.run(
        ["git", "-C", str(row["repo"]), "show", f"{row['commit']}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines(keepends=True)
    lines[m["line"] - 1] = m["after"] + "\n"
    out = {k: v for k, v in row.items() if k != "prefill"}
    out["messages"] = [{"role": "user", "content": request(row, hint, "".join(lines))}]
    if hint == "line":
        out["prefill"] = edit_prefill(path, m["after"].strip())
    return out


def edit_prefill(path: str, old: str) -> str:
    """The start of an edit call on `old` (JSON-escaped), left open at the new text."""
    head = json.dumps({"name": "edit", "arguments": {"path": path, "old": old, "new": ""}})
    return "<tool_call>" + head.removesuffix('""}}') + '"'


def _split(paths: Sequence[str], val_fraction: float) -> set[str]:
    """The held-out source files: a fixed share of them, by a hash of the path."""
    if len(paths) < 2 or val_fraction <= 0:
        return set()
    ranked = sorted(paths, key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    n = min(len(paths) - 1, max(1, round(len(paths) * val_fraction)))
    return set(ranked[:n])


def build_dataset(
    repo: str | Path,
    out: str | Path,
    *,
    rev: str = "HEAD",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    tests: Sequence[str] | None = DEFAULT_TESTS,
    test_command: str = DEFAULT_TEST_COMMAND,
    kinds: Sequence[str] | None = KINDS,
    max_per_file: int = DEFAULT_MAX_PER_FILE,
    max_per_function: int = DEFAULT_MAX_PER_FUNCTION,
    min_failing: int = 1,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    hint: str = "none",
    seed: int = 0,
    all_tests_cover: bool = False,
    log: Any = None,
) -> BuildReport:
    """Write `out/train.jsonl` and `out/val.jsonl` (see the module docstring). `repo` is a git
    repository, or a directory or sdist snapshotted into `out/source/NAME`. `include` and
    `exclude` pick the source files (gitignore globs; default every .py file that is not a
    test); `tests` picks the test files; `test_command` runs them (pytest: it must accept
    node ids and --junitxml). `all_tests_cover`: every test file covers every source file (for
    a package whose tests import only the package, not its modules). `log(line)` hears progress."""
    from agentrft.tools.repo_workspace import create_workspace

    tests = tests or DEFAULT_TESTS
    kinds = kinds or KINDS
    if hint not in HINTS:
        raise ConfigError(f"hint {hint!r} is not one of {', '.join(HINTS)}")
    bad = sorted(set(kinds) - set(KINDS))
    if bad:
        raise ConfigError(f"unknown bug kind {', '.join(bad)}; use some of: {', '.join(KINDS)}")
    command_argv(test_command)
    repo = resolve_source(repo, Path(out) / "source")
    say = log or (lambda line: None)
    commit = _resolve(repo, rev)
    report = BuildReport(commit=commit)
    test_spec = pathspec.PathSpec.from_lines("gitwildmatch", list(tests))
    inc = pathspec.PathSpec.from_lines("gitwildmatch", list(include) or ["*.py"])
    exc = pathspec.PathSpec.from_lines("gitwildmatch", [*exclude, "conftest.py"])
    root = create_workspace(str(repo), commit, "code-fix-build", "commit")
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        all_files = sorted(
            p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file()
        )
        test_files = [p for p in all_files if test_spec.match_file(p)]
        sources = [
            p
            for p in all_files
            if p.endswith(".py")
            and inc.match_file(p)
            and not exc.match_file(p)
            and p not in test_files
        ]
        if not sources:
            raise ConfigError(
                f"{repo}@{commit[:12]}: no source file matches --include {list(include) or ['*.py']}; "
                "name the files to inject bugs into, e.g. --include 'src/mypkg/*.py'"
            )
        imports = {t: imported_modules((root / t).read_text(errors="replace")) for t in test_files}
        for path in sources:
            names = module_names(path)
            stem = Path(path).stem
            covering = [
                t
                for t in test_files
                if all_tests_cover
                or imports[t] & names
                or Path(t).stem in (f"test_{stem}", f"{stem}_test")
            ]
            if not covering:
                report.files[path] = {
                    "status": "skipped: no test file imports it or is named after it"
                }
                continue
            original = (root / path).read_text()
            clean = run_tests(root, covering, test_command)
            if clean.returncode != 0 or not clean.passed:
                report.files[path] = {
                    "status": f"skipped: its tests do not pass before any bug ({len(clean.broken)} failing, exit {clean.returncode})"
                }
                say(f"{path}: tests fail before injection:\n{clean.output[-600:]}")
                continue
            try:
                found = mutations(original, path, kinds)
            except SyntaxError as err:
                report.files[path] = {"status": f"skipped: does not parse (line {err.lineno})"}
                continue
            picked = choose(found, max_per_file, max_per_function, seed)
            kept = 0
            for m in picked:
                (root / path).write_text(m.source)
                try:
                    run = run_tests(root, covering, test_command)
                finally:
                    (root / path).write_text(original)
                failing = run.broken
                if run.timed_out:
                    reason = "timeout"
                elif not failing:
                    reason = "not_caught"
                elif any("::" not in t or not run.outcomes.get(t) for t in failing) or not (
                    set(failing) <= set(clean.passed)
                ):
                    reason = "collection_error"
                elif len(failing) < min_failing:
                    reason = "too_few_failing"
                else:
                    reason = ""
                say(
                    f"{path}:{m.line} {m.kind} in {m.function}: {reason or f'kept ({len(failing)} failing)'}"
                )
                if reason:
                    report.dropped[reason] += 1
                    continue
                detail = run.details.get(failing[0], "")
                row: dict[str, Any] = {
                    "messages": [],
                    "repo": str(repo),
                    "commit": commit,
                    "files": [path],
                    "patch": m.patch(original),
                    "tests": covering,
                    "shown_test": failing[0],
                    "shown_output": detail
                    if len(detail) <= OUTPUT_MAX_CHARS
                    else "..." + detail[-OUTPUT_MAX_CHARS:],
                    "failing": failing,
                    "passing_clean": len(clean.passed),
                    "test_command": test_command,
                    "mutation": {
                        "kind": m.kind,
                        "function": m.function,
                        "line": m.line,
                        "before": m.before,
                        "after": m.after,
                    },
                }
                if hint == "repair":
                    (root / path).write_text(m.source)
                    try:
                        text, row["fix_candidate"], row["localization"] = repair_request(row, root)
                    finally:
                        (root / path).write_text(original)
                else:
                    text = request(row, hint, m.source)
                row["messages"] = [{"role": "user", "content": text}]
                if hint == "line":
                    row["prefill"] = edit_prefill(path, m.after.strip())
                rows.setdefault(path, []).append(row)
                report.kept_kinds[m.kind] += 1
                kept += 1
            report.files[path] = {
                "status": f"{len(found)} possible bugs, {len(picked)} tried, {kept} kept ({len(clean.passed)} tests in {len(covering)} files)"
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    held_out = _split(sorted(rows), val_fraction)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train = [r for p in sorted(rows) if p not in held_out for r in rows[p]]
    val = [r for p in sorted(rows) if p in held_out for r in rows[p]]
    for name, part in (("train", train), ("val", val)):
        write_jsonl(out / f"{name}.jsonl", part)
    for path in rows:
        report.files[path]["status"] += " -> val" if path in held_out else " -> train"
    report.train, report.val = len(train), len(val)
    return report
