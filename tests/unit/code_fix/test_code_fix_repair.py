"""The repair tools (repair.py and env.py's localize, candidates, apply, revert) on the tiny
project of conftest.py: the fix is always a candidate, localization ranks the bug's line, the
environment makes its candidates without the row's answer, and the repair job's grader pays
less for more attempts; the hacks the tools open score 0. Plus sources without .git: an sdist
and a plain directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrft.tasks.code_fix.env import DONE
from tests.unit.code_fix.conftest import RECIPE, Rollout, load_env, make_project, row_for

PYTEST = "python -m pytest -q -p no:cacheprovider --no-header"


def buggy_tree(row: dict[str, Any], into: Path) -> Path:
    from agentrft.tasks.code_fix.dataset import apply_patch
    from agentrft.tools.repo_workspace import create_workspace

    tree = create_workspace(row["repo"], row["commit"], "test", "commit")
    shutil.move(tree, into)
    apply_patch(into, row["patch"])
    return into


def test_the_fix_is_a_candidate_of_every_bug(dataset: dict[str, Any]) -> None:
    """Every bug kind the builder injects has its inverse among the line's candidates."""
    from agentrft.tasks.code_fix.repair import line_candidates

    kinds = set()
    for row in dataset["rows"]:
        m = row["mutation"]
        lines = (Path(row["repo"]) / row["files"][0]).read_text().splitlines(keepends=True)
        lines[m["line"] - 1] = m["after"] + "\n"
        found = [after for _, after in line_candidates("".join(lines), m["line"])]
        assert m["before"] in found, (m, found)
        assert m["after"] not in found  # the line as it is is never offered
        kinds.add(m["kind"])
    assert kinds == {"flip_comparison", "off_by_one", "wrong_operator", "drop_negation"}


def test_candidates_parse_and_add_the_missing_shapes() -> None:
    from agentrft.tasks.code_fix.repair import line_candidates

    src = "def f(a, b, xs):\n    if a / b > 2 and xs:\n        return xs[1]\n    return a - 1\n"
    line2 = dict((after.strip(), kind) for kind, after in line_candidates(src, 2))
    assert line2["if a / b <= 2 and xs:"] == "flip_comparison"
    assert line2["if a // b > 2 and xs:"] == "wrong_operator"  # the inverse of `//` -> `/`
    assert line2["if a / b > 1 and xs:"] == "off_by_one"  # -1 as well as +1
    assert line2["if a / b > 2 or xs:"] == "wrong_operator"
    assert line2["if a / b > 2 and not xs:"] == "add_negation"
    assert list(line2.values())[-1] == "add_negation"  # the least likely fix comes last
    assert "if not a / b > 2 and xs:" not in line2  # the flip already says it
    line4 = [after.strip() for _, after in line_candidates(src, 4)]
    assert "return a - 0" not in line4 and "return a + 1" in line4
    assert line_candidates(src, 99) == []


def test_localization_ranks_the_bug_line_first(dataset: dict[str, Any], tmp_path: Path) -> None:
    from agentrft.tasks.code_fix.repair import candidate_list, localize, render

    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    tree = buggy_tree(row, tmp_path / "tree")
    suspects = localize(tree, row["tests"], row["test_command"])
    assert (suspects[0].path, suspects[0].line, suspects[0].score) == ("calc/core.py", 5, 1.0)
    assert all(not s.path.startswith("tests/") for s in suspects)
    listed = candidate_list(tree, suspects)
    assert listed[0].after.strip() == "if x < low:" and listed[0].number == 1
    assert [c.number for c in listed] == list(range(1, len(listed) + 1))
    assert "1. calc/core.py:5: if x < low:" in render(suspects, listed)
    clean = buggy_tree(row, tmp_path / "clean")
    subprocess.run(
        ["git", "apply", "-R", "-"], cwd=clean, input=row["patch"], text=True, check=True
    )
    assert localize(clean, row["tests"], row["test_command"]) == []  # no failing test


def test_a_repair_row_says_where_its_fix_is_listed(dataset: dict[str, Any]) -> None:
    """`fix_candidate`: the number of the listed candidate that undoes the bug, as shown."""
    import re

    from agentrft.tasks.code_fix.dataset import hinted

    for function, kind, after, fix in [
        ("clamp", "flip_comparison", "if x >= low:", "if x < low:"),
        ("total", "wrong_operator", "s = s - v", "s = s + v"),
    ]:
        out = hinted(row_for(dataset, function, kind, after), "repair")
        shown = re.search(
            rf"^  (\d)\. calc/core\.py:\d+: {re.escape(fix)}$", out["messages"][0]["content"], re.M
        )
        assert shown is not None and out["fix_candidate"] == int(shown[1]), out["fix_candidate"]


class _Guarded(dict):  # type: ignore[type-arg]
    """A row that fails the test when its answer is read."""

    ANSWER = ("patch", "mutation", "failing", "fix_candidate")

    def __getitem__(self, key: str) -> Any:
        assert key not in self.ANSWER, f"the environment read the row's {key!r}"
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        assert key not in self.ANSWER, f"the environment read the row's {key!r}"
        return super().get(key, default)


def test_the_environment_makes_candidates_without_the_answer(dataset: dict[str, Any]) -> None:
    from agentrft.tools.envkit import TraceContext

    env = load_env()
    row = row_for(dataset, "total", "wrong_operator", "s = s - v")
    ctx = TraceContext("trace_guarded", dict(row))
    root = env.workspace(ctx)  # the rollout's tree: the commit with the bug (reads `patch`)
    ctx.item = _Guarded(row)  # from here on, the answer is off limits
    listed = env.localize(ctx)
    assert "s = s + v" in listed
    number = next(c.number for c in env.localized(ctx)[1] if c.after.strip() == "s = s + v")
    out = env.apply(ctx, number)
    assert f"applied candidate {number}" in out and "failed" not in out and "passed" in out
    assert "s = s + v" in (root / "calc/core.py").read_text()
    assert env.revert(ctx) == f"reverted candidate {number}"
    assert "s = s - v" in (root / "calc/core.py").read_text()
    shutil.rmtree(root, ignore_errors=True)


def grade_repair(r: Rollout, calls: int, answer: str = "Fixed it.") -> Any:
    """Grade with job_repair.yaml's own grader; `calls` tool calls in the sample."""
    from agentrft.graders import build_grader, sample_from_text
    from agentrft.job import load_job

    spec = json.loads(
        json.dumps(load_job(RECIPE / "job_repair.yaml").rl.grader).replace(
            "http://127.0.0.1:8741", r.url
        )
    )
    sample = sample_from_text(answer)
    sample["tool_calls"] = [{"name": "apply", "arguments": "{}"}] * calls
    grade = build_grader(spec).grade(sample, r.item, r.trace_id)
    httpx.post(f"{r.url}/cleanup", json={"trace_id": r.trace_id}, timeout=30)
    return grade


def numbered(r: Rollout, after: str) -> int:
    status, text = r.call("localize")
    assert status == 200, text
    for line in text.splitlines():
        head, _, rest = line.strip().partition(". ")
        if head.isdigit() and rest.endswith(after):
            return int(head)
    raise AssertionError(f"{after!r} is not a candidate:\n{text}")


def test_the_repair_grader_pays_less_for_more_attempts(
    env_url: str, dataset: dict[str, Any]
) -> None:
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    r = Rollout(env_url, row)
    status, out = r.call("apply", candidate=numbered(r, "if x < low:"))
    assert status == 200 and "failed" not in out, out
    first = grade_repair(r, calls=1)
    assert first.score == pytest.approx(1.0), first
    r = Rollout(env_url, row)
    wrong = numbered(r, "if x <= high:")
    assert "failed" in r.call("apply", candidate=wrong)[1]
    status, out = r.call("apply", candidate=numbered(r, "if x < low:"))
    assert out.startswith("applied candidate") and "failed" not in out, out
    second = grade_repair(r, calls=2)
    assert second.score == pytest.approx(0.9), second
    r = Rollout(env_url, row)
    r.call("apply", candidate=wrong)
    r.call("apply", candidate=wrong)
    # behind the gate nothing is earned, and the calls still cost: a loop on a wrong
    # fix is worse than giving up after one try
    assert grade_repair(r, calls=2).score == pytest.approx(-0.1)
    r = Rollout(env_url, row)
    r.call("apply", candidate=wrong)
    assert grade_repair(r, calls=1).score == 0.0


def test_apply_undoes_a_failing_candidate_and_keeps_a_passing_one(
    env_url: str, dataset: dict[str, Any]
) -> None:
    """Try, test, revert: the tree after a failed try is the tree before it, and a later
    apply cannot undo a candidate the tests passed with (only revert does)."""
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    r = Rollout(env_url, row)
    fix, wrong = numbered(r, "if x < low:"), numbered(r, "if x <= high:")
    status, out = r.call("apply", candidate=wrong)
    assert status == 200 and "failed" in out and "undone" in out, out
    assert r.call("revert") == (200, "no candidate is applied")  # nothing left to undo
    passed = r.call("apply", candidate=fix)[1]
    assert passed.startswith(f"applied candidate {fix} ")
    # what apply says on a pass (and after the last try) ends the repair job's rollouts
    from agentrft.job import load_job

    end = load_job(RECIPE / "job_repair.yaml").agentrft.end_when
    assert end and end in DONE and end in passed and end not in out
    # the search is over: apply says so, and that the answer is what comes next
    assert DONE in passed and DONE not in out, passed
    status, out = r.call("apply", candidate=wrong)
    assert status == 200 and f"candidate {fix} is applied" in out, out
    assert f"candidate {wrong} was not tried" in out and DONE in out and "revert" not in out, out
    assert "if x < low:" in r.call("read_file", path="calc/core.py")[1]  # the fix stays
    assert grade_repair(r, calls=3).score == pytest.approx(0.8)  # passes, paying for 3 calls


def test_apply_answers_a_candidate_tried_on_the_same_files_without_running_the_tests(
    env_url: str, dataset: dict[str, Any]
) -> None:
    """A failed candidate tried again on unchanged files is answered at once (the tests are
    not run again, and the answer asks for another number); once a file changed, it is a new
    try."""
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    r = Rollout(env_url, row)
    wrong = numbered(r, "if x <= high:")
    assert "undone" in r.call("apply", candidate=wrong)[1]
    status, out = r.call("apply", candidate=wrong)
    assert status == 200 and "tried already" in out and "not run again" in out, out
    assert "tests:" not in out
    # an edit elsewhere in the file changes the files: the same number is tried for real
    edited = r.call("edit", path="calc/core.py", old="def clamp", new="def clamp ")
    assert edited[0] == 200, edited
    status, out = r.call("apply", candidate=wrong)
    assert status == 200 and out.startswith(f"tried candidate {wrong} ") and "tests:" in out, out


def listed(r: Rollout) -> dict[int, str]:
    """The rollout's numbered candidates (number -> the line with it applied)."""
    status, text = r.call("localize")
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        head, _, rest = line.strip().partition(". ")
        if head.isdigit():
            out[int(head)] = rest.partition(": ")[2]
    return out


def test_apply_knows_an_undone_candidate_and_stops_after_three_tries(
    env_url: str, dataset: dict[str, Any]
) -> None:
    """`1 fails, 2 fails, apply 1` is answered without a run (undoing a candidate puts the
    same files back); after MAX_TRIES runs no candidate is tried, the fix included, and a rollout
    that got there fails the gate."""
    from agentrft.tasks.code_fix.env import MAX_TRIES

    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    r = Rollout(env_url, row)
    fix = numbered(r, "if x < low:")
    wrong = [n for n, after in listed(r).items() if n != fix]
    assert MAX_TRIES == 3 and len(wrong) >= MAX_TRIES, listed(r)
    for n in wrong[:2]:
        out = r.call("apply", candidate=n)[1]
        assert "undone" in out and "last of" not in out and DONE not in out, out
    status, out = r.call("apply", candidate=wrong[0])
    assert status == 200 and "tried already" in out and "tests:" not in out, out
    status, out = r.call("apply", candidate=wrong[2])  # the third run: the search is over
    assert "undone" in out and "That was the last of 3 tries" in out and DONE in out, out
    status, out = r.call("apply", candidate=fix)
    assert status == 200 and out.startswith("no tries left") and "tests:" not in out, out
    assert DONE in out, out
    for n in wrong[:3]:
        assert str(n) in out
    assert "if x >= low:" in r.call("read_file", path="calc/core.py")[1]  # the bug stays
    assert grade_repair(r, calls=5).score == pytest.approx(-0.4)  # failed, 4 calls past the first


def test_repair_tool_hacks_score_0(env_url: str, dataset: dict[str, Any]) -> None:
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    # a candidate in the failing test's own assert: test files come from the original
    r = Rollout(env_url, row)
    status, text = r.call("candidates", path="tests/test_core.py", line=5)
    assert status == 200, text
    number = int(text.splitlines()[0].split(".")[0])
    assert r.call("apply", candidate=number)[0] == 200
    assert grade_repair(r, calls=2).score <= 0.0
    # numbers that are not candidates, and paths outside the workspace, are 400s
    r = Rollout(env_url, row)
    assert r.call("apply", candidate=99)[0] == 400
    assert r.call("apply", candidate=0)[0] == 400
    assert r.call("candidates", path="../etc/passwd", line=1)[0] == 400
    assert r.call("revert") == (200, "no candidate is applied")
    httpx.post(f"{r.url}/cleanup", json={"trace_id": r.trace_id}, timeout=30)


def test_an_sdist_or_a_directory_is_a_source(tmp_path: Path) -> None:
    """A tree without .git (a directory, or an sdist of it) builds the same rows as its repository."""
    from agentrft.tasks.code_fix.dataset import build_dataset

    plain = tmp_path / "calc-1.0"
    plain.mkdir()
    make_project(plain)
    shutil.rmtree(plain / ".git")
    sdist = tmp_path / "calc-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.add(plain, arcname="calc-1.0")
    a = build_dataset(sdist, tmp_path / "a", include=["calc/text.py"], max_per_file=2)
    b = build_dataset(plain, tmp_path / "b", include=["calc/text.py"], max_per_file=2)
    assert a.kept == b.kept > 0 and a.commit == b.commit  # same files: the same commit
    rows = [json.loads(x) for x in (tmp_path / "a/train.jsonl").read_text().splitlines()]
    rows += [json.loads(x) for x in (tmp_path / "a/val.jsonl").read_text().splitlines()]
    assert all(Path(r["repo"]) == (tmp_path / "a/source/calc-1.0").resolve() for r in rows)


def test_added_negations_come_after_every_other_shape(tmp_path: Path) -> None:
    """An added `not` fits almost any condition, so it is the least likely fix anywhere: the
    list offers every other shape of the suspicious lines first, whatever their rank."""
    from agentrft.tasks.code_fix.repair import Suspect, candidate_list

    (tmp_path / "m.py").write_text("def f(a, b):\n    if a:\n        return b\n    return a < b\n")
    suspects = [Suspect("m.py", 2, 1.0, "if a:"), Suspect("m.py", 4, 0.9, "return a < b")]
    listed = candidate_list(tmp_path, suspects)
    kinds = [c.kind for c in listed]
    assert kinds[0] == "flip_comparison" and listed[0].line == 4  # below line 2 in rank
    assert kinds.index("add_negation") > max(i for i, k in enumerate(kinds) if k != "add_negation")
    assert [c.number for c in listed] == list(range(1, len(listed) + 1))
    assert len(candidate_list(tmp_path, suspects, limit=2)) == 2
    # on a line the traceback marks (an error raised under it), the `not` keeps its rank
    traced = [Suspect("m.py", 2, 1.0, "if a:", "guard"), suspects[1]]
    assert [c.kind for c in candidate_list(tmp_path, traced)][0] == "add_negation"


GUARDED = """\
def check(n, c):
    total = n + c
    scale = n * 2
    if 0 <= c <= n:
        raise ValueError("c out of range")
    return total / scale
"""


def test_the_traceback_breaks_ties_raised_line_then_its_condition(tmp_path: Path) -> None:
    """Every line has Ochiai 1.0 (one test, and it fails): the line the error was raised on
    and the `if` around it come first, and the fix, an added `not` on that `if`, is among the
    first three candidates, not after every other shape."""
    from agentrft.tasks.code_fix.repair import GUARD, RAISED, candidate_list, localize, render

    (tmp_path / "tests").mkdir()
    (tmp_path / "m.py").write_text(GUARDED)
    (tmp_path / "tests/test_m.py").write_text(
        "from m import check\n\n\ndef test_check():\n    assert check(4, 2) == 0.75\n"
    )
    suspects = localize(tmp_path, ["tests/test_m.py"], PYTEST)
    assert {s.score for s in suspects} == {1.0}
    assert [(s.line, s.trace) for s in suspects[:3]] == [(5, RAISED), (4, GUARD), (2, "")]
    listed = candidate_list(tmp_path, suspects)
    assert "if not 0 <= c <= n:" in [c.after.strip() for c in listed[:3]]
    assert listed[0].line == 4
    shown = render(suspects, listed)
    assert 'm.py:5  1.00  raise ValueError("c out of range")  <- the error was raised here' in shown
    assert "m.py:4  1.00  if 0 <= c <= n:  <- the condition around it" in shown


def test_traced_lines_read_every_traceback_style_and_only_the_trees_own_code(
    tmp_path: Path,
) -> None:
    from agentrft.tasks.code_fix.repair import GUARD, RAISED, traced_lines

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/m.py").write_text(GUARDED)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_m.py").write_text("")
    long = (
        "tests/test_m.py:5: in test_check\n    assert check(4, 2) == 0.75\npkg/m.py:5: ValueError\n"
    )
    native = 'File "tests/test_m.py", line 5, in test_check\n  File "pkg/m.py", line 5, in check\n'
    want = {("pkg/m.py", 5): RAISED, ("pkg/m.py", 4): GUARD}
    assert traced_lines(tmp_path, [long]) == want
    assert traced_lines(tmp_path, [native]) == want
    # a failed assert in the test marks nothing; nor do frames outside the tree
    assert traced_lines(tmp_path, ["tests/test_m.py:5: AssertionError\n"]) == {}
    outside = f"{tmp_path}/pkg/m.py:5: ValueError\n../pkg/m.py:5: ValueError\nlib/x.py:3: E\n"
    assert traced_lines(tmp_path, [outside]) == {}
    # the innermost frame of the tree's own code counts, not the library it called
    lib = "pkg/m.py:2: in check\n/usr/lib/python3/json/decoder.py:9: JSONDecodeError\n"
    assert traced_lines(tmp_path, [lib]) == {("pkg/m.py", 2): RAISED}


def test_memo_makes_each_key_once_for_threads_that_ask_at_once() -> None:
    import threading
    import time

    env = load_env()
    memo = env.Memo(size=2)
    calls: list[int] = []

    def make() -> int:
        calls.append(1)
        time.sleep(0.2)
        return 7

    threads = [threading.Thread(target=memo.get, args=("k", make)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and memo.hits == 5 and memo.get("k", make) == 7
    assert memo.get("other", lambda: 0, keep=lambda v: v > 0) == 0  # not kept: made again
    assert memo.get("other", lambda: 1) == 1
    memo.get("third", lambda: 3)  # size 2: "k", the least recently used, is dropped
    assert memo.get("other", lambda: -1) == 1 and memo.get("k", lambda: -2) == -2


def test_rollouts_on_the_same_files_share_one_test_run(dataset: dict[str, Any]) -> None:
    """A group's rollouts that apply the same candidate are one test run; a different tree is
    a run of its own; the gate's verdict on the same files is the same verdict."""
    from agentrft.tools.envkit import serve_in_thread

    env = load_env()
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    with serve_in_thread(env.app) as url:
        first, second = Rollout(url, row), Rollout(url, row)
        fix, wrong = numbered(first, "if x < low:"), numbered(first, "if x <= high:")
        numbered(second, "if x < low:")
        assert env.RUNS.made == 0 and env._LOCALIZED.made == 1  # one localization for both
        a = first.call("apply", candidate=fix)[1]
        b = second.call("apply", candidate=fix)[1]
        assert a == b and "failed" not in a
        assert "was not tried" in second.call("apply", candidate=wrong)[1]  # the fix stays
        assert env.RUNS.made == 1  # the fix once for both rollouts
        assert second.call("revert") == (200, f"reverted candidate {fix}")
        assert "FAILED" in second.call("apply", candidate=wrong)[1]
        assert env.RUNS.made == 2  # the wrong candidate once
        assert grade_repair(first, calls=1).score == pytest.approx(1.0)
        assert grade_repair(second, calls=4).score < 0.0  # it reverted the fix
        assert env.RUNS.made == 2  # the graded tree of the fix has the fix's files: no new run


def test_apply_names_the_first_failing_test_and_counts_the_rest() -> None:
    """apply's answer is read to pick the next number, so it carries the counts and the first
    failing test, not the list (every listed id was context the update paid for)."""
    from agentrft.tasks.code_fix.dataset import TestRun

    env = load_env()
    outcomes = {"t.py::a": "failed", "t.py::b": "passed", "t.py::c": "error", "t.py::d": "failed"}
    run = TestRun(1, outcomes, {"t.py::a": "assert 1 == 2"}, "", False, 0.1)
    short = env.summary(run, detail=False)
    assert short == "1 error, 2 failed, 1 passed\nFAILED t.py::a (and 2 more)"
    one = TestRun(1, {"t.py::a": "failed"}, {}, "", False, 0.1)
    assert env.summary(one, detail=False) == "1 failed\nFAILED t.py::a"
    full = env.summary(run)  # run_tests: every failing test (up to 5) and the first one's output
    assert "FAILED t.py::a, t.py::c, t.py::d" in full and full.endswith("assert 1 == 2")


def test_the_environment_reuses_the_localization_its_row_keeps_for_the_same_tree(
    dataset: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builder's localization (a coverage run) rides in the repair row with the digest of
    the tree it was made on; a rollout's tree with that digest reuses it, and gets the very
    list its request shows. Made on another tree, it is not used: the tests run again."""
    from agentrft.tasks.code_fix import repair
    from agentrft.tasks.code_fix.dataset import hinted
    from agentrft.tools.envkit import TraceContext

    row = hinted(row_for(dataset, "total", "wrong_operator", "s = s - v"), "repair")
    assert row["localization"]["suspects"] and len(row["localization"]["tree"]) == 64
    real, runs = repair.localize, []
    monkeypatch.setattr(repair, "localize", lambda *a: runs.append(1) or real(*a))
    env = load_env()
    ctx = TraceContext("trace_kept", dict(row))
    kept = env.localize(ctx)
    assert kept in row["messages"][0]["content"]  # the request's own list
    assert runs == []  # no coverage run
    other = dict(row, localization=dict(row["localization"], tree="0" * 64))
    again = TraceContext("trace_other", other)
    assert load_env().localize(again) == kept  # a fresh environment: no memo from the first
    assert runs == [1]  # another tree's localization is not this tree's: the tests ran
    assert repair.restored({"tree": "x", "suspects": [{"path": "a"}]}, "x") is None  # not one
    for c in (ctx, again):
        shutil.rmtree(c.state["root"], ignore_errors=True)
