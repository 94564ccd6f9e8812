"""The tools an automated-repair agent has, for any Python repository with pytest tests
(stage: rollout tools; the data builder also calls them to write the repair variant's request).

- **Fault localization** (`localize`): the tests run once under `coverage` inside the sandbox,
  each test in its own coverage context (a 10-line pytest plugin switches the context to the
  test's node id), and every line of non-test code gets its **Ochiai** score,
  `ef / sqrt(F * (ef + ep))`: ef and ep the failing and passing tests that ran it, F all
  failing tests. Ranked highest first. Ties are broken by the failing tests' tracebacks, as
  stack-trace-aware localizers do: the line an error was raised on first, then the condition
  of the `if` or `while` around that line, then file and line order.
- **Template fix candidates** (`line_candidates`): the inverses of the common one-line bug
  shapes, TBar-style, for every expression on a line: negate a comparison (`<` <-> `>=`, `==`
  <-> `!=`, `in` <-> `not in`, `is` <-> `is not`), an integer constant +1 or -1, swap an
  operator (`+` <-> `-`, `*` <-> `/`, `/` <-> `//`, `and` <-> `or`), drop a `not`, add a
  `not` in front of a condition. Each candidate parses and changes the program.
- **A numbered list** (`candidate_list`, `render`): the candidates of the most suspicious lines,
  numbered 1.. in rank order (every added `not` after the other shapes, except on a line the
  traceback marks), that `apply` picks from by number.

Everything is computed from the tree and its tests alone: nothing here reads a row's answer
(its `patch` or `mutation`), so it works the same on real bugs.

A localization is a whole coverage run, so the data builder keeps the one it made for a
row's request in the row (`stored`, with the digest of the tree it was made on); the
environment uses it for a rollout's tree when the digests match (`restored`), and runs
its own otherwise.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec

from agentrft.errors import ConfigError
from agentrft.tasks.code_fix.dataset import (
    CONFIG_FILES,
    DEFAULT_TESTS,
    bug_edits,
    command_argv,
    run_tests,
    segment_edit,
)
from agentrft.tools.envkit import ToolInputError
from agentrft.tools.repo_workspace import confine

MAX_CANDIDATES = 9  # one digit: the model's whole choice is a single token
MAX_SUSPECTS = 5  # lines shown by localize
_RC = ".agentrft-coveragerc"
_DATA = ".agentrft-coverage"
_PLUGIN = "agentrft_coverage_contexts"
_RC_TEXT = f"[run]\nrelative_files = True\ndata_file = {_DATA}\nsource = .\n"
# Each test in its own coverage context, named by its pytest node id (as in the junit report).
_PLUGIN_TEXT = """\
import coverage
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")
"""
_TEST_FILES = pathspec.PathSpec.from_lines(
    "gitwildmatch", [*DEFAULT_TESTS, "test_*.py", "*_test.py"]
)


def is_test_code(path: str, tests: Sequence[str] = ()) -> bool:
    """Test files, conftest.py and pytest's configuration: never a place to fix."""
    name = PurePosixPath(path).name
    return (
        name == "conftest.py"
        or name in CONFIG_FILES
        or path in tests
        or _TEST_FILES.match_file(path)
    )


@dataclass(frozen=True)
class Suspect:
    path: str
    line: int
    score: float  # Ochiai
    text: str
    trace: str = ""  # RAISED, GUARD or "" (see traced_lines)


@dataclass(frozen=True)
class Candidate:
    number: int  # 1-based, as the model names it
    path: str
    line: int
    kind: str
    before: str  # the line now
    after: str  # the line with the candidate applied


RAISED = "raised"  # a failing test's error was raised on this line
GUARD = "guard"  # the condition of the `if` or `while` around a RAISED line
_TRACE_ORDER = {RAISED: 0, GUARD: 1, "": 2}
_TRACE_NOTE = {RAISED: "  <- the error was raised here", GUARD: "  <- the condition around it"}
# a frame of a pytest traceback: `path.py:12: in name` or `path.py:12: Error` (--tb=long or
# short), or `File "path.py", line 12, in name` (--tb=native)
_FRAME = re.compile(
    r'^(?:(?P<path>[^\s:"]+\.py):(?P<line>\d+): |\s*File "(?P<npath>[^"]+\.py)", line (?P<nline>\d+))',
    re.M,
)


def traced_lines(
    root: Path, failures: Iterable[str], tests: Sequence[str] = ()
) -> dict[tuple[str, int], str]:
    """(path, line) -> RAISED for the innermost frame in the tree's own non-test code of each
    failing test's traceback (`failures`: pytest's failure texts), and -> GUARD for the
    one-line condition of the innermost `if` or `while` whose body holds that line. A test
    whose error came from the test itself (a failed assert) marks nothing."""
    raised: set[tuple[str, int]] = set()
    for text in failures:
        frames = [
            (m["path"] or m["npath"], int(m["line"] or m["nline"])) for m in _FRAME.finditer(text)
        ]
        own = [
            (path, line)
            for path, line in frames
            if not is_test_code(path, tests) and _in_tree(root, path)
        ]
        if own:
            raised.add(own[-1])
    marks: dict[tuple[str, int], str] = dict.fromkeys(raised, RAISED)
    trees: dict[str, ast.AST | None] = {}  # each file parsed once, however many tests fail
    for path, line in sorted(raised):
        if path not in trees:
            try:
                trees[path] = ast.parse((root / path).read_text(errors="replace"))
            except SyntaxError:
                trees[path] = None
        tree = trees[path]
        guard = None if tree is None else _guard_of(tree, line)
        if guard is not None:
            marks.setdefault((path, guard), GUARD)
    return marks


def _in_tree(root: Path, path: str) -> bool:
    """A file of the tree at `root` (not absolute, no `..`, no link out of it)."""
    try:
        return confine(root, path).is_file()
    except ToolInputError:
        return False


def _guard_of(tree: ast.AST, line: int) -> int | None:
    """The line of the one-line condition of the innermost `if` or `while` whose body (or
    else) holds `line`; None when there is none."""
    best: tuple[int, int] | None = None  # (the statement's first line, its condition's line)
    for node in ast.walk(tree):
        if not isinstance(node, ast.If | ast.While) or node.test.lineno != node.test.end_lineno:
            continue
        for body in (node.body, node.orelse):
            inside = body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno)
            if inside and (best is None or node.lineno > best[0]):
                best = (node.lineno, node.test.lineno)
    return None if best is None else best[1]


def coverage_argv(test_command: str) -> str:
    """`python -m pytest ...` as `python -m coverage run ... -m pytest -p PLUGIN ...`."""
    argv = command_argv(test_command)
    if argv[1:3] != ["-m", "pytest"]:
        raise ConfigError(
            f"test command {test_command!r}: fault localization runs pytest under coverage, so the "
            "command must start with `python -m pytest`"
        )
    return " ".join(
        ["python", "-m", "coverage", "run", f"--rcfile={_RC}", "-m", "pytest", "-p", _PLUGIN]
        + argv[3:]
    )


def ochiai(covering: dict[str, set[str]], failing: set[str]) -> float:
    """Ochiai's suspiciousness of a line run by the tests `covering[...]`."""
    tests = set().union(*covering.values()) if covering else set()
    ef = len(tests & failing)
    ep = len(tests - failing)
    return ef / math.sqrt(len(failing) * (ef + ep)) if ef and failing else 0.0


def localize(root: Path, tests: Sequence[str], test_command: str) -> list[Suspect]:
    """Every line of non-test code that a failing test ran, by Ochiai score (highest first;
    among equal scores the lines the tracebacks mark first, see traced_lines). Empty when no
    test fails; a RuntimeError when coverage wrote no data."""
    run = run_tests(
        root,
        list(tests),
        coverage_argv(test_command),
        extra_files={_RC: _RC_TEXT, f"{_PLUGIN}.py": _PLUGIN_TEXT},
        read_back=[_DATA],
    )
    failing = set(run.broken)
    if not failing:
        return []
    if _DATA not in run.files:
        raise RuntimeError(f"coverage wrote no data; the run said:\n{run.output[-600:]}")
    passing = set(run.passed)
    traced = traced_lines(root, (run.details.get(t, "") for t in sorted(failing)), tests)
    with tempfile.TemporaryDirectory(prefix="agentrft-cov-") as tmp:
        db = Path(tmp) / "coverage"
        db.write_bytes(run.files[_DATA])
        by_line = lines_by_context(db)
    found: list[Suspect] = []
    for (path, line), contexts in by_line.items():
        if is_test_code(path, tests) or path == f"{_PLUGIN}.py":
            continue
        ran = {c for c in contexts if c in failing or c in passing}
        score = ochiai({"": ran}, failing)
        if score <= 0:
            continue
        lines = (root / path).read_text(errors="replace").splitlines()
        text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        found.append(Suspect(path, line, round(score, 4), text, traced.get((path, line), "")))
    return sorted(found, key=lambda s: (-s.score, _TRACE_ORDER[s.trace], s.path, s.line))


def lines_by_context(data_file: Path) -> dict[tuple[str, int], set[str]]:
    """(file, line) -> the coverage contexts (test node ids) that ran it, read with coverage's
    own data API from the file a run wrote."""
    from coverage import CoverageData

    data = CoverageData(basename=str(data_file))
    data.read()
    return {
        (path, line): set(contexts)
        for path in data.measured_files()
        for line, contexts in data.contexts_by_lineno(path).items()
    }


def line_candidates(source: str, line: int) -> list[tuple[str, str]]:
    """(kind, new line) for every template fix of line `line` (1-based) of `source`, in column
    order (added `not`s last), each one parsing and changing the program."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    if not 0 < line <= len(lines):
        return []
    text = lines[line - 1]
    dump = ast.dump(tree)
    seen: set[str] = {text}
    out: list[tuple[str, str]] = []
    for node, parent in _nodes_on(tree, line):
        for kind, new in [*bug_edits(node, parent, text), *_inverse_edits(node, parent, text)]:
            if new in seen:
                continue
            seen.add(new)
            try:
                changed = ast.dump(ast.parse("".join([*lines[: line - 1], new, *lines[line:]])))
            except SyntaxError:
                continue
            if changed != dump:
                out.append((kind, new.rstrip("\n")))
    # an added `not` is the least likely fix (it fits almost any condition): last
    return sorted(out, key=lambda kn: kn[0] == "add_negation")


def _nodes_on(tree: ast.AST, line: int) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(node, parent) of every expression that starts and ends on `line`, in column order;
    not inside f-strings (their inside is text first)."""
    found: list[tuple[ast.AST, ast.AST]] = []
    stack: list[tuple[ast.AST, ast.AST]] = [(c, tree) for c in ast.iter_child_nodes(tree)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, ast.JoinedStr):
            continue
        if getattr(node, "lineno", None) == line == getattr(node, "end_lineno", None):
            found.append((node, parent))
        stack.extend((c, node) for c in ast.iter_child_nodes(node))
    yield from sorted(found, key=lambda np: getattr(np[0], "col_offset", 0))


def _inverse_edits(node: ast.AST, parent: ast.AST, line: str) -> Iterator[tuple[str, str]]:
    """The fix shapes that are not a bug shape of `bug_edits` turned around: a constant -1,
    `/` -> `//`, and a `not` added in front of a condition."""
    raw = line.encode()
    if (
        isinstance(node, ast.Constant)
        and type(node.value) is int
        and isinstance(parent, ast.Compare | ast.Slice | ast.Subscript | ast.BinOp | ast.Call)
    ):
        start, end = node.col_offset, node.end_col_offset or 0
        # `x - 1` -> `x - 0` is no fix anyone writes; an index or a bound can be 0
        lowest = 2 if isinstance(parent, ast.BinOp) else 1
        if raw[start:end].decode().isdigit() and node.value >= lowest:
            yield "off_by_one", (raw[:start] + str(node.value - 1).encode() + raw[end:]).decode()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        new = segment_edit(
            line, node.left.end_col_offset or 0, node.right.col_offset, r"(?<!/)/(?!/)", "//"
        )
        if new is not None:
            yield "wrong_operator", new
    condition = (
        (isinstance(parent, ast.If | ast.While | ast.IfExp | ast.Assert) and node is parent.test)
        or isinstance(parent, ast.BoolOp)
        or (isinstance(parent, ast.comprehension) and node in parent.ifs)
        or (  # a returned or assigned value that reads as a truth value
            isinstance(parent, ast.Return | ast.Assign)
            and node is parent.value
            and isinstance(node, ast.Compare | ast.Name | ast.Attribute | ast.Call)
        )
    )
    negated = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    # `not a < b` is `a >= b`, which the flipped comparison already offers
    flippable = isinstance(node, ast.Compare) and len(node.ops) == 1
    # `not` written before `a and b` binds to `a` alone: its operands get their own
    if (
        condition
        and isinstance(node, ast.expr)
        and not (negated or flippable or isinstance(node, ast.BoolOp))
    ):
        col = node.col_offset
        yield "add_negation", (raw[:col] + b"not " + raw[col:]).decode()


def candidate_list(
    root: Path, suspects: Sequence[Suspect], limit: int = MAX_CANDIDATES
) -> list[Candidate]:
    """The candidates of the most suspicious lines, numbered 1.. in rank order, at most
    `limit`: first every changed operator, comparison or constant of the lines in rank order,
    then the added `not`s (they fit almost any condition, so they are the least likely fix
    anywhere, not only on their own line), except on a line the traceback marks: a raising
    line or the condition around it keeps its `not` in its rank. Lines are read until `limit`
    candidates of the first kind are found or the suspects run out."""
    likely: list[tuple[Suspect, str, str, str]] = []
    unlikely: list[tuple[Suspect, str, str, str]] = []
    sources: dict[str, str] = {}
    for s in suspects:
        if len(likely) >= limit:
            break
        if s.path not in sources:
            sources[s.path] = (root / s.path).read_text(errors="replace")
        try:
            found = line_candidates(sources[s.path], s.line)
        except SyntaxError:
            continue
        before = sources[s.path].splitlines()[s.line - 1]
        for kind, after in found:
            demoted = kind == "add_negation" and not s.trace
            (unlikely if demoted else likely).append((s, kind, before, after))
    return [
        Candidate(i, s.path, s.line, kind, before, after)
        for i, (s, kind, before, after) in enumerate((likely + unlikely)[:limit], 1)
    ]


def render(suspects: Sequence[Suspect], candidates: Sequence[Candidate]) -> str:
    """What the model reads: the suspicious lines, then the numbered candidates."""
    if not suspects:
        return "No test fails, so there is nothing to localize."
    head = ["Suspicious lines (Ochiai score over the tests' coverage), most suspicious first:"]
    head += [
        f"  {s.path}:{s.line}  {s.score:.2f}  {s.text}{_TRACE_NOTE.get(s.trace, '')}"
        for s in suspects[:MAX_SUSPECTS]
    ]
    if not candidates:
        return "\n".join([*head, "No fix candidates for these lines."])
    head.append("Fix candidates (apply one by its number):")
    head += [f"  {c.number}. {c.path}:{c.line}: {c.after.strip()}" for c in candidates]
    return "\n".join(head)


def tree_digest(root: Path) -> str:
    """A digest of every file's path and bytes under `root`."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def stored(root: Path, suspects: Sequence[Suspect]) -> dict[str, Any]:
    """A localization made on the tree `root`, as a row keeps it (JSON)."""
    return {"tree": tree_digest(root), "suspects": [dataclasses.asdict(s) for s in suspects]}


def restored(kept: Any, digest: str) -> list[Suspect] | None:
    """The suspects of a kept localization (`stored`) when it was made on the tree with this
    digest; None when it was made on another tree, or is not one."""
    if not isinstance(kept, dict) or kept.get("tree") != digest:
        return None
    try:
        return [Suspect(**s) for s in kept["suspects"]]
    except (KeyError, TypeError):
        return None
