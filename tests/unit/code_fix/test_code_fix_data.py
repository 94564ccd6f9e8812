"""`agentrft data code-fix`: bugs injected with ast on one line each, kept only where a test
fails with the bug and every test passes without it; split by source file."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from agentrft.errors import ConfigError
from agentrft.tasks.code_fix.dataset import KINDS, choose, edit_prefill, mutations, parse_junit
from tests.needs import needs_bwrap

from .conftest import CORE, make_project


def test_each_kind_changes_one_line_at_the_operator() -> None:
    found = mutations(CORE, "calc/core.py")
    kinds = {m.kind for m in found}
    assert kinds == set(KINDS)
    for m in found:
        before, after = CORE.splitlines(), m.source.splitlines()
        assert len(before) == len(after)
        changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        assert changed == [m.line - 1], m
        assert ast.dump(ast.parse(m.source)) != ast.dump(ast.parse(CORE))
    lines = {(m.kind, m.after.strip()) for m in found}
    assert ("flip_comparison", "if x >= low:") in lines
    assert ("wrong_operator", "s = s - v") in lines
    assert ("off_by_one", "return n % 3 == 0") in lines
    assert ("drop_negation", "if words:") in lines
    assert ("off_by_one", "return words[1]") in lines


def test_docstrings_strings_and_fstrings_are_left_alone() -> None:
    source = 'def f(a):\n    """a < b and 1 + 2"""\n    x = f"{a + 1}"\n    return "<" + x\n'
    lines = {m.after.strip() for m in mutations(source, "m.py")}
    assert lines == {'return "<" - x'}


def test_choose_spreads_kinds_and_is_seeded() -> None:
    found = mutations(CORE, "calc/core.py")
    a = choose(found, 4, 1, seed=3)
    assert len(a) == 4 and len({m.function for m in a}) == 4
    assert a == choose(found, 4, 1, seed=3)
    assert len({m.kind for m in a}) >= 3  # kinds in turn (one per function limits the mix)


def test_junit_node_ids_match_pytest() -> None:
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_core" name="test_a" file="tests/test_core.py"/>
      <testcase classname="tests.test_core.TestX" name="test_b[1-2]" file="tests/test_core.py">
        <failure message="boom">assert 1 == 2</failure></testcase>
      <testcase classname="tests.test_core" name="test_c" file="tests/test_core.py"><skipped/></testcase>
    </testsuite></testsuites>"""
    outcomes, details = parse_junit(xml)
    assert outcomes == {
        "tests/test_core.py::test_a": "passed",
        "tests/test_core.py::TestX::test_b[1-2]": "failed",
        "tests/test_core.py::test_c": "skipped",
    }
    assert details["tests/test_core.py::TestX::test_b[1-2]"] == "assert 1 == 2"


def test_edit_prefill_is_an_open_json_call() -> None:
    text = edit_prefill("a.py", 'if x == "y":')
    closed = json.loads(text.removeprefix("<tool_call>") + 'z"}}')
    assert closed == {
        "name": "edit",
        "arguments": {"path": "a.py", "old": 'if x == "y":', "new": "z"},
    }


@needs_bwrap
def test_rows_are_bugs_the_tests_catch(dataset: dict, project: Path) -> None:
    report, rows = dataset["report"], dataset["rows"]
    assert report.kept == len(rows) > 5
    assert report.dropped["not_caught"] >= 1  # `untested` has no test
    assert not any(r["mutation"]["function"] == "untested" for r in rows)
    for row in rows:
        assert row["messages"][-1]["role"] == "user"
        assert row["shown_test"] in row["failing"]
        assert row["shown_test"] in row["messages"][-1]["content"]
        assert row["patch"] not in row["messages"][-1]["content"]
        assert row["files"][0] in row["patch"]
        # the patch applies to the commit and is the bug
        check = subprocess.run(
            ["git", "-C", str(project), "apply", "--check", "-"], input=row["patch"], text=True
        )
        assert check.returncode == 0
    # split by file: no source file has rows on both sides
    train = {
        json.loads(x)["files"][0] for x in (dataset["out"] / "train.jsonl").read_text().splitlines()
    }
    val = {
        json.loads(x)["files"][0] for x in (dataset["out"] / "val.jsonl").read_text().splitlines()
    }
    assert train and val and not train & val
    lines = "\n".join(report.lines())
    assert "kept" in lines and "dropped" in lines


@needs_bwrap
def test_refuses_tests_that_fail_before_any_bug(tmp_path: Path) -> None:
    from agentrft.tasks.code_fix.dataset import build_dataset

    repo = tmp_path / "repo"
    repo.mkdir()
    make_project(repo)
    (repo / "tests/test_text.py").write_text("def test_broken():\n    assert False\n")
    subprocess.run(
        ["git", "-C", str(repo), "commit", "-qam", "broken", "--author", "t <t@e>"],
        check=True,
        env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e", "PATH": "/usr/bin:/bin"},
    )
    report = build_dataset(repo, tmp_path / "out", include=["calc/text.py"])
    assert report.kept == 0
    assert "do not pass before any bug" in report.files["calc/text.py"]["status"]


def test_bad_input_is_refused_with_the_fix(tmp_path: Path, project: Path) -> None:
    from agentrft.tasks.code_fix.dataset import build_dataset

    with pytest.raises(ConfigError, match="does not exist"):
        build_dataset(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a git repository, a directory or an sdist"):
        build_dataset(tmp_path / "notes.txt", tmp_path / "out")
    with pytest.raises(ConfigError, match="--rev"):
        build_dataset(project, tmp_path / "out", rev="no-such-rev")
    with pytest.raises(ConfigError, match="--include"):
        build_dataset(project, tmp_path / "out", include=["nothing/*.py"])
    with pytest.raises(ConfigError, match="unknown bug kind"):
        build_dataset(project, tmp_path / "out", kinds=["typo"])
