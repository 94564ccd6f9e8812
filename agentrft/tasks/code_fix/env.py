"""Code-fix environment (stage: rollout tools + endpoint graders) for rows built by
`agentrft data code-fix`: the model fixes an injected bug so that the project's tests pass.

Each rollout (`trace_id`) gets its own workspace, made on its first tool call: the row's
`commit` exported with `git archive` (agentrft.tools.repo_workspace) and the row's `patch`
(the bug) applied. Tools: read_file, grep (shared with the other repository recipes), an
exact-string `edit(path, old, new)`, and `run_tests(selector)`, which runs pytest on a copy
of the workspace inside agentrft.sandbox (no network, time and memory limits). The repair
tools of repair.py (for any pytest repository): `localize` (Ochiai fault localization over the
tests' per-test coverage, then numbered fix candidates), `candidates(path, line)`,
`apply(candidate)` (undo the last candidate, apply this one, run the tests) and `revert`. Paths
are relative to the repository root and confined to the workspace.

Graders, three endpoints read in this order by the job's `multi` (a gate, as in the talk):
  POST /grade            tests: 1 when the row's tests pass in a FRESH sandbox run, else 0.
                         The tree graded is the original commit plus the rollout's changes to
                         existing source files only: test files, conftest.py, pytest's config
                         files and any new file are taken from the original, so editing,
                         skipping or shadowing a test earns nothing. Every test the bug broke
                         must pass, including those the model was never shown, and at least
                         as many tests must pass as before the bug (a skip does not count).
  POST /grade/style      style, deterministic: the mean of the diff's size against the
                         minimal fix, no debug print, and no new ruff finding.
  POST /grade/validated  1 when the rollout's last run_tests came after its last edit, covered
                         the failing test and passed (it checked its work before answering).

The workspace stays until agentrft's /cleanup after all three grades (cleanup_after_grade is
off), on the idle TTL, or when the server stops.

Run by agentrft for the job (job.yaml, `agentrft.environment`), or by hand:
    uvicorn env:app --port 8741
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentrft.tasks.code_fix import repair
from agentrft.tasks.code_fix.dataset import OUTPUT_MAX_CHARS, apply_patch, run_tests
from agentrft.tools import repo_workspace as rw
from agentrft.tools.envkit import ToolInputError, ToolServer, TraceContext

env = ToolServer("code-fix", cleanup_after_grade=False)
# Test runs at once (tools and grading together): each is a whole pytest process.
TEST_RUNS = threading.BoundedSemaphore(2)
V = TypeVar("V")


class Memo(Generic[V]):
    """Results by key, each made once even when many threads ask for it at once (the others
    wait for the first), at most `size` kept (least recently used dropped first). A group's
    rollouts share a tree, so its localization and its test runs on the same files are one
    run each: a test run depends only on the files, the tests and the command, which make the
    key. `keep(value)` False: not kept (a run stopped at its time limit is tried again)."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._done: OrderedDict[Hashable, V] = OrderedDict()
        self._making: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.made = self.hits = 0

    def get(
        self, key: Hashable, make: Callable[[], V], keep: Callable[[V], bool] | None = None
    ) -> V:
        with self._lock:
            if key in self._done:
                self.hits += 1
                self._done.move_to_end(key)
                return self._done[key]
            lock = self._making.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._done:
                    self.hits += 1
                    return self._done[key]
            try:
                value = make()
            finally:
                with self._lock:
                    self._making.pop(key, None)
            with self._lock:
                self.made += 1
                if keep is None or keep(value):
                    self._done[key] = value
                    while len(self._done) > self.size:
                        self._done.popitem(last=False)
            return value


# Test runs by (tree digest, node ids, command): the same files give the same verdicts.
RUNS: Memo[Any] = Memo()
_DEBUG = re.compile(r"\bprint\(|\bbreakpoint\(|\bpdb\b|\bpprint\(")
# Code under test is imported by pytest, so it could rewrite pytest (every test "passes") or
# end the run early. A fix of a one-line bug needs none of these: an added line naming one
# fails the gate. A deny-list, so a determined model can still find a way past it.
_RUNNER = re.compile(
    r"\b_?pytest\b|\bunittest\b|\bsys\.(modules|exit|settrace|setprofile)\b|\bbuiltins\b"
    r"|__builtins__|\bos\._exit\b|\batexit\b|\bimportlib\b|__import__|\bjunit"
)


# -- workspaces --------------------------------------------------------------------------------
def workspace(ctx: TraceContext) -> Path:
    """The rollout's workspace: the row's commit with its bug applied, made on first use."""
    with ctx.lock:
        if ctx.state.get("closed"):
            raise RuntimeError(f"trace {ctx.trace_id} was already cleaned up")
        if "root" not in ctx.state:
            root = rw.create_workspace(
                str(ctx.item.get("repo") or ""),
                str(ctx.item.get("commit") or ""),
                ctx.trace_id,
                "commit",
            )
            try:
                apply_patch(root, str(ctx.item.get("patch") or ""))
            except BaseException:
                shutil.rmtree(root, ignore_errors=True)
                raise
            ctx.state.update(root=root, edits=0, runs=[])
        made: Path = ctx.state["root"]
        return made


@env.on_cleanup
def cleanup(ctx: TraceContext) -> None:
    """Delete the rollout's workspace and the tree its grading exported."""
    rw.remove_workspace(ctx)
    graded = ctx.state.pop("graded", None)
    if graded is not None:
        shutil.rmtree(graded["tree"], ignore_errors=True)


# -- tools ---------------------------------------------------------------------------------------
@env.tool(description=rw.READ_FILE_DESCRIPTION, parameters=rw.READ_FILE_PARAMETERS)
def read_file(
    ctx: TraceContext, path: str, start_line: int = 1, end_line: int | None = None
) -> str:
    return rw.read_file_in(workspace(ctx), path, start_line, end_line)


GREP_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": rw.GREP_PARAMETERS["properties"]["pattern"],
        "path": rw.GREP_PARAMETERS["properties"]["path"],
        "glob": rw.GREP_PARAMETERS["properties"]["glob"],
    },
    "required": ["pattern"],
    "additionalProperties": False,
}


GREP_DESCRIPTION = f"Search file contents with a regular expression; returns up to {rw.GREP_MAX_MATCHES} matches as path:line: text."


@env.tool(description=GREP_DESCRIPTION, parameters=GREP_PARAMETERS)
def grep(ctx: TraceContext, pattern: str, path: str = ".", glob: str | None = None) -> str:
    return rw.grep_in(workspace(ctx), pattern, path, glob)


PATH_PARAMETER = {
    "type": "string",
    "description": 'File relative to the repository root, e.g. "src/app.py".',
}
EDIT_DESCRIPTION = "Replace the exact text `old` with `new` in a file. `old` must occur exactly once in the file (copy it from read_file, without the line numbers)."
EDIT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": PATH_PARAMETER,
        "old": {"type": "string", "description": "The exact text to replace."},
        "new": {"type": "string", "description": "The text to put in its place."},
    },
    "required": ["path", "old", "new"],
    "additionalProperties": False,
}


@env.tool(description=EDIT_DESCRIPTION, parameters=EDIT_PARAMETERS)
def edit(ctx: TraceContext, path: str, old: str, new: str) -> str:
    root = workspace(ctx)
    full = rw.confine(root, path)
    if not full.is_file():
        raise ToolInputError(f"no such file: {path!r}")
    if not isinstance(old, str) or not isinstance(new, str) or not old:
        raise ToolInputError("`old` must be non-empty text of the file and `new` text")
    text = rw.read_text(full)
    if text is None:
        raise ToolInputError(f"{path} is binary or too large to edit")
    count = text.count(old)
    if count == 0:
        raise ToolInputError(
            f"`old` does not occur in {path}; read_file it and copy the text exactly (without line numbers)"
        )
    if count > 1:
        raise ToolInputError(
            f"`old` occurs {count} times in {path}; add surrounding lines so it occurs once"
        )
    line = text[: text.index(old)].count("\n") + 1
    full.write_text(text.replace(old, new, 1))
    with ctx.lock:
        ctx.state["edits"] += 1
    return f"edited {path} at line {line}"


RUN_TESTS_DESCRIPTION = "Run the project's tests with pytest in a sandbox and show the result. `selector`: test files or node ids separated by spaces (default: the tests of this task)."
RUN_TESTS_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "selector": {
            "type": "string",
            "description": 'e.g. "tests/test_app.py" or "tests/test_app.py::test_add"',
        }
    },
    "additionalProperties": False,
}


def selectors(root: Path, selector: str | None, default: list[str]) -> list[str]:
    """The selector's node ids, each a path inside the workspace (no pytest options)."""
    parts = (selector or "").split() or default
    for part in parts:
        if part.startswith("-"):
            raise ToolInputError(f"{part!r}: options are not allowed, only test files and node ids")
        rw.confine(root, part.split("::", 1)[0])
    return parts


def summary(run: Any, detail: bool = True) -> str:
    """What the model reads: the counts, then the failing tests and the first failure's
    output (cut). Not `detail` (apply's answer, where the next choice is another number):
    the first failing test only, and how many more."""
    counts: dict[str, int] = {}
    for outcome in run.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    head = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no tests ran"
    if run.timed_out:
        head += " (stopped at the time limit)"
    if not run.broken:
        return head if run.outcomes else f"{head}\n{run.output[-OUTPUT_MAX_CHARS:]}"
    if not detail:
        more = len(run.broken) - 1
        return f"{head}\nFAILED {run.broken[0]}" + (f" (and {more} more)" if more else "")
    failed = f"{head}\nFAILED {', '.join(run.broken[:5])}"
    first = run.broken[0]
    return f"{failed}\n\n{first}:\n{run.details.get(first, '')[-OUTPUT_MAX_CHARS:]}"


@env.tool(name="run_tests", description=RUN_TESTS_DESCRIPTION, parameters=RUN_TESTS_PARAMETERS)
def run_tests_tool(ctx: TraceContext, selector: str = "") -> str:
    root = workspace(ctx)
    return tested(ctx, root, selectors(root, selector, list(ctx.item.get("tests") or [])))


def run_once(root: Path, parts: list[str], test_command: str) -> Any:
    """`run_tests` on `root`, or the verdicts of an earlier run on the same files (RUNS)."""

    def make() -> Any:
        with TEST_RUNS:
            return run_tests(root, parts, test_command)

    return RUNS.get((repair.tree_digest(root), tuple(parts), test_command), make, _sound)


def _sound(run: Any) -> bool:
    return not run.timed_out


def tested(ctx: TraceContext, root: Path, parts: list[str], detail: bool = True) -> str:
    """Run the tests `parts` on the workspace, record the run (the `validated` bonus reads it)
    and return what the model reads (`summary`)."""
    edits = ctx.state["edits"]
    run = run_once(root, parts, str(ctx.item.get("test_command")))
    shown = str(ctx.item.get("shown_test") or "")
    ok = run.returncode == 0 and bool(run.outcomes) and not run.broken
    with ctx.lock:
        ctx.state["runs"].append(
            {"edits": edits, "passed": ok, "covers": run.outcomes.get(shown) == "passed"}
        )
    return summary(run, detail)


# -- repair tools (agentrft.tasks.code_fix.repair): localize, candidates, apply, revert -----------
# A rollout's numbered list is made once, on its first use, from its workspace and the row's
# tests (never from the row's patch or mutation). Rollouts of the same tree share one
# localization run (the memo is keyed by the tree's content).
_LOCALIZED: Memo[tuple[list[repair.Suspect], list[repair.Candidate]]] = Memo(256)


def localized(ctx: TraceContext) -> tuple[list[repair.Suspect], list[repair.Candidate]]:
    """The rollout's suspicious lines and numbered candidates (made on first use)."""
    root = workspace(ctx)
    with ctx.lock:
        if "localized" in ctx.state:
            made: tuple[list[repair.Suspect], list[repair.Candidate]] = ctx.state["localized"]
            return made
    tests, command = list(ctx.item.get("tests") or []), str(ctx.item.get("test_command"))

    digest = repair.tree_digest(root)

    def make() -> tuple[list[repair.Suspect], list[repair.Candidate]]:
        # the data builder's localization of this very tree, kept in the row, else a run
        suspects = repair.restored(ctx.item.get("localization"), digest)
        if suspects is None:
            with TEST_RUNS:
                suspects = repair.localize(root, tests, command)
        return suspects, repair.candidate_list(root, suspects)

    hit = _LOCALIZED.get((digest, tuple(tests), command), make)
    with ctx.lock:
        ctx.state.setdefault("localized", (hit[0], list(hit[1])))
        result: tuple[list[repair.Suspect], list[repair.Candidate]] = ctx.state["localized"]
        return result


LOCALIZE_DESCRIPTION = "Fault localization: run the tests with coverage and list the most suspicious lines (Ochiai score), then numbered fix candidates for them."


@env.tool(
    description=LOCALIZE_DESCRIPTION,
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)
def localize(ctx: TraceContext) -> str:
    return repair.render(*localized(ctx))


CANDIDATES_DESCRIPTION = "Numbered fix candidates for one line of a file (flipped comparison, off-by-one, swapped operator, dropped or added `not`); apply one by its number."
CANDIDATES_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": PATH_PARAMETER,
        "line": {"type": "integer", "description": "Line number (1-based)."},
    },
    "required": ["path", "line"],
    "additionalProperties": False,
}


@env.tool(description=CANDIDATES_DESCRIPTION, parameters=CANDIDATES_PARAMETERS)
def candidates(ctx: TraceContext, path: str, line: int) -> str:
    root = workspace(ctx)
    full = rw.confine(root, path)
    text = rw.read_text(full) if full.is_file() else None
    if text is None:
        raise ToolInputError(f"no such text file: {path!r}")
    try:
        found = repair.line_candidates(text, int(line))
    except SyntaxError as err:
        raise ToolInputError(f"{path} does not parse (line {err.lineno})") from None
    listed = localized(ctx)[1]
    before = text.splitlines()[int(line) - 1] if 0 < int(line) <= text.count("\n") + 1 else ""
    with ctx.lock:
        known = {(c.path, c.line, c.after): c for c in listed}
        shown = []
        for kind, after in found:
            c = known.get((path, int(line), after))
            if c is None:
                c = repair.Candidate(len(listed) + 1, path, int(line), kind, before, after)
                listed.append(c)
                known[(path, int(line), after)] = c
            shown.append(c)
    if not shown:
        return f"no fix candidates for {path}:{line}"
    return "\n".join(f"{c.number}. {c.path}:{c.line}: {c.after.strip()}" for c in shown)


MAX_TRIES = 3  # test runs by apply in one rollout: the search ends when they are spent
# the search is over (a pass, or the tries spent): the only thing left is the answer, and
# every further call is a cost (an earlier answer offered a revert, and trained models took it)
DONE = "The task is over: reply with one short sentence, and call no more tools."
APPLY_DESCRIPTION = f"Try fix candidate number `candidate`: apply it, run the tests, and undo it if they fail. A candidate that passed stays applied. At most {MAX_TRIES} tries."
APPLY_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "candidate": {
            "type": "integer",
            "minimum": 1,
            "maximum": repair.MAX_CANDIDATES,  # the list's size: constrained calls stay in it
            "description": "The candidate's number.",
        }
    },
    "required": ["candidate"],
    "additionalProperties": False,
}


@env.tool(description=APPLY_DESCRIPTION, parameters=APPLY_PARAMETERS)
def apply(ctx: TraceContext, candidate: int) -> str:
    """Try, test, revert: the candidate stays only when the tests pass with it, and a
    candidate that passed is kept until `revert` (so a later try cannot undo a fix). A
    failed candidate asked for again on the same files is answered without a run, and after
    MAX_TRIES runs no candidate is tried."""
    root = workspace(ctx)
    listed = localized(ctx)[1]
    chosen = next((c for c in listed if c.number == candidate), None)
    if chosen is None:
        raise ToolInputError(
            f"no candidate {candidate}; the candidates are 1..{len(listed)} (see localize)"
            if listed
            else "there are no fix candidates (no test fails, or no line has one)"
        )
    with ctx.lock:
        kept = ctx.state.get("applied")
        tried: dict[int, str] = ctx.state.setdefault("failed", {})  # number -> the files' digest
        spent = ctx.state.get("tries", 0)
    if kept is not None:
        return (
            f"candidate {kept['number']} is applied and the tests passed with it, so the bug is "
            f"fixed; candidate {chosen.number} was not tried. {DONE}"
        )
    # the same candidate on the same files (an undo puts the files back): the tests would
    # fail again
    if chosen.number in tried and tried[chosen.number] == repair.tree_digest(root):
        return (
            f"candidate {chosen.number} was tried already and the tests failed with it; "
            "nothing changed since, so the tests were not run again. Apply another candidate."
        )
    if spent >= MAX_TRIES:
        numbers = ", ".join(str(n) for n in tried)
        return (
            f"no tries left: the tests ran with {spent} candidates ({numbers}), the most a task "
            f"allows, and failed with each. Candidate {chosen.number} was not tried. {DONE}"
        )
    before = repair.tree_digest(root)
    full = rw.confine(root, chosen.path)
    lines = full.read_text().splitlines(keepends=True)
    if lines[chosen.line - 1].rstrip("\n") != chosen.before:
        raise ToolInputError(
            f"{chosen.path}:{chosen.line} changed since the candidates were made; edit it back"
        )
    original = "".join(lines)
    end = "\n" if lines[chosen.line - 1].endswith("\n") else ""
    lines[chosen.line - 1] = chosen.after + end
    full.write_text("".join(lines))
    with ctx.lock:
        ctx.state["edits"] += 1
        ctx.state["tries"] = spent + 1
        ctx.state["applied"] = {"number": chosen.number, "path": chosen.path, "text": original}
    # the counts and the failing tests only: the next choice is another number, not a reading
    try:
        result = tested(ctx, root, list(ctx.item.get("tests") or []), detail=False)
    except BaseException:
        undo(ctx, root)  # untested: not kept (a kept candidate is one the tests passed with)
        raise
    head = f"candidate {chosen.number} ({chosen.path}:{chosen.line}: {chosen.after.strip()})"
    with ctx.lock:
        passed = ctx.state["runs"][-1]["passed"]
    if passed:
        return f"applied {head}\ntests: {result}\nThe tests pass; it stays applied. {DONE}"
    undo(ctx, root)
    with ctx.lock:
        tried[chosen.number] = before
    out = f"tried {head}\ntests: {result}\nThe tests fail with it, so it was undone."
    if spent + 1 >= MAX_TRIES:  # the model reads that its search is over before it calls again
        out += f" That was the last of {MAX_TRIES} tries: no candidate can be tried now. {DONE}"
    return out


def undo(ctx: TraceContext, root: Path) -> int | None:
    """Put back the file the applied candidate changed; its number, None when none was."""
    with ctx.lock:
        applied = ctx.state.pop("applied", None)
    if applied is None:
        return None
    rw.confine(root, applied["path"]).write_text(applied["text"])
    with ctx.lock:
        ctx.state["edits"] += 1
    number: int = applied["number"]
    return number


@env.tool(
    description="Undo the fix candidate applied last.",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)
def revert(ctx: TraceContext) -> str:
    undone = undo(ctx, workspace(ctx))
    return f"reverted candidate {undone}" if undone else "no candidate is applied"


# -- graders -------------------------------------------------------------------------------------
def protected(path: str, item: dict[str, Any]) -> bool:
    """Files whose edits never count: tests, conftest.py, pytest's configuration."""
    return repair.is_test_code(path, list(item.get("tests") or []))


def _files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def graded_tree(ctx: TraceContext, item: dict[str, Any]) -> dict[str, Any]:
    """The tree the graders read, made once per trace: a fresh export of the original commit
    plus the rollout's final text of existing, unprotected files (test files, conftest.py,
    pytest's config and any file the rollout made stay as in the original). Returns {"tree",
    "start": {path: text when the rollout began (with the bug)}, "final": {path: text at the
    end, None when deleted}} over the files the rollout changed and the bug's files, and
    "unfixed": every bug file is as the bug left it."""
    with ctx.lock:
        if "graded" in ctx.state:
            cached: dict[str, Any] = ctx.state["graded"]
            return cached
        root: Path | None = ctx.state.get("root")
    tree = rw.create_workspace(
        str(item.get("repo") or ""),
        str(item.get("commit") or ""),
        f"graded-{ctx.trace_id}",
        "commit",
    )
    try:
        bug_files = list(item.get("files") or [])
        apply_patch(tree, str(item.get("patch") or ""))
        start = {p: (tree / p).read_text() for p in bug_files}  # the tree is now the bug's
        final: dict[str, str | None] = dict(start)  # no tool call: the bug is all there is
        if root is not None:
            now = _files(root)
            for path, full in _files(tree).items():
                if protected(path, item):
                    continue
                if path not in now:
                    final[path] = None
                elif now[path].read_bytes() != full.read_bytes() or path in start:
                    final[path] = now[path].read_text(errors="replace")
        for path, text in final.items():
            start.setdefault(path, (tree / path).read_text(errors="replace"))
            if text is None:
                (tree / path).unlink()
            else:
                (tree / path).write_text(text)
    except BaseException:
        shutil.rmtree(tree, ignore_errors=True)
        raise
    unfixed = all(final.get(p) == start[p] for p in bug_files)
    graded = {"tree": tree, "start": start, "final": final, "unfixed": unfixed}
    with ctx.lock:
        ctx.state["graded"] = graded
    return graded


@env.grader
def tests(ctx: TraceContext, sample: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """The gate: the row's tests pass on the graded tree, held-back tests included."""
    g = graded_tree(ctx, item)
    if g["unfixed"]:
        return {"score": 0.0, "metrics": {"why": "the bug is still in the code"}}
    reaching = [line for line in added_lines(g) if _RUNNER.search(line)]
    if reaching:
        return {
            "score": 0.0,
            "metrics": {"why": f"reaches into the test runner: {reaching[0][:120]}"},
        }
    run = run_once(g["tree"], list(item.get("tests") or []), str(item.get("test_command")))
    failing = list(item.get("failing") or [])
    fixed = [t for t in failing if run.outcomes.get(t) == "passed"]
    passed = (
        run.returncode == 0
        and not run.broken
        and len(fixed) == len(failing)
        and len(run.passed) >= int(item.get("passing_clean") or 0)
    )
    why = (
        "passed"
        if passed
        else (
            "timed out"
            if run.timed_out
            else f"{len(run.broken)} failing, {len(fixed)}/{len(failing)} broken tests fixed, "
            f"{len(run.passed)}/{item.get('passing_clean')} passing, exit {run.returncode}"
        )
    )
    return {
        "score": 1.0 if passed else 0.0,
        "sub_scores": {"fixed_share": len(fixed) / len(failing) if failing else 0.0},
        "metrics": {"why": why, "tests_passed": len(run.passed)},
    }


def added_lines(g: dict[str, Any]) -> list[str]:
    """The lines the rollout added to the graded files (its diff from where it started)."""
    return [
        line[1:]
        for path, text in g["final"].items()
        for line in difflib.unified_diff(
            g["start"][path].splitlines(), (text or "").splitlines(), lineterm="", n=0
        )
        if line.startswith("+") and not line.startswith("+++")
    ]


def changed_lines(before: str, after: str) -> int:
    """Lines removed plus lines added by a diff from `before` to `after`."""
    return sum(
        1
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def ruff_findings(text: str, path: str, config_dir: Path) -> int:
    """ruff's findings for `text` as file `path`, under the project's own configuration.
    ruff only reads the code, it never runs it, so it runs outside the sandbox."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "json",
            "--stdin-filename",
            path,
            "-",
        ],
        cwd=config_dir,
        input=text,
        text=True,
        capture_output=True,
    )
    try:
        return len(json.loads(proc.stdout or "[]"))
    except json.JSONDecodeError:
        raise RuntimeError(f"ruff failed: {proc.stderr.strip()[:300]}") from None


@env.grader(name="style")
def style(ctx: TraceContext, sample: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """Deterministic style: diff size against the minimal fix, no debug print, lint clean."""
    g = graded_tree(ctx, item)
    minimal = max(changed_lines(*_patch_sides(str(item.get("patch") or ""))), 1)
    edited = {p: (g["start"][p], t or "") for p, t in g["final"].items() if t != g["start"][p]}
    size = sum(changed_lines(a, b) for a, b in edited.values())
    diff = min(1.0, minimal / size) if size else 0.0
    no_debug = 0.0 if any(_DEBUG.search(line) for line in added_lines(g)) else 1.0
    new_findings = sum(
        max(0, ruff_findings(b, p, g["tree"]) - ruff_findings(a, p, g["tree"]))
        for p, (a, b) in edited.items()
        if p.endswith(".py") and g["final"][p] is not None
    )
    lint = 1.0 if new_findings == 0 else 0.0
    return {
        "score": (diff + no_debug + lint) / 3,
        "sub_scores": {"diff": diff, "no_debug": no_debug, "lint": lint},
        "metrics": {
            "changed_lines": size,
            "minimal_lines": minimal,
            "new_ruff_findings": new_findings,
        },
    }


def _patch_sides(patch: str) -> tuple[str, str]:
    """The removed and the added lines of a unified diff, as two texts."""
    lines = [line for line in patch.splitlines() if not line.startswith(("+++", "---"))]
    removed = "\n".join(line[1:] for line in lines if line.startswith("-"))
    added = "\n".join(line[1:] for line in lines if line.startswith("+"))
    return removed, added


@env.grader(name="validated")
def validated(ctx: TraceContext, sample: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """1 when the last run_tests came after the last edit, ran the failing test and passed."""
    runs = ctx.state.get("runs") or []
    last = runs[-1] if runs else None
    ok = (
        last is not None
        and last["edits"] == ctx.state.get("edits")
        and last["passed"]
        and last["covers"]
    )
    return {"score": 1.0 if ok else 0.0, "metrics": {"test_runs": len(runs)}}


app = env.app
