"""`agentrft data repo-qa`: questions whose facts are really in the code at the row's commit,
a split by file with no overlap, worked examples from training rows, and a user's own rows."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

from agentrft.cli import main
from agentrft.errors import ConfigError
from agentrft.tasks.repo_research.dataset import (
    BuildReport,
    build_dataset,
    call_text,
    is_held_out,
    load_qa_rows,
    pick_worked_examples,
    questions_from_code,
)
from agentrft.tools.code_search import read_tree

from .conftest import MODULES, ROOT


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def defined_names(source: str) -> frozenset[str]:
    return frozenset(
        n.name
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


def assert_facts_in_code(rows: list[dict]) -> None:
    """Each fact is a path of the row's commit, or text of one of its source files, and the
    question is about code those files hold."""
    trees: dict[tuple[str, str], dict[str, str | None]] = {}
    for row in rows:
        tree = trees.setdefault((row["repo"], row["commit"]), read_tree(row["repo"], row["commit"]))
        texts = [tree[p] or "" for p in row["source_files"]]
        for fact in row["facts"]:
            assert fact in tree or any(fact in t for t in texts), (
                row["messages"][-1]["content"],
                fact,
            )
        if row["kind"] == "where_defined":
            (path,) = row["facts"]
            assert row["subject"] in defined_names(tree[path] or "")
        if row["kind"] == "imports":
            for path in row["facts"]:
                assert row["subject"] in (tree[path] or "")
        if row["kind"] == "docstring":
            quoted = row["messages"][-1]["content"].split('"')[1]
            assert any(quoted in t for t in texts)


def test_questions_from_a_small_repository(py_repo):
    repo, commit = py_repo
    report = BuildReport(repo)
    sources = {
        p: t for p, t in read_tree(repo, commit).items() if p.endswith(".py") and t is not None
    }
    got = {(q.kind, q.subject): q.facts for q in questions_from_code(sources, report)}
    assert got[("where_defined", "load_settings")] == ["pkg/config.py"]
    assert got[("where_defined", "Settings")] == ["pkg/config.py"]
    assert got[("returns", "load_settings")] == ["dict[str, int]"]
    assert got[("returns", "open_channel")] == ["socket.socket"]
    assert got[("raises", "load_settings")] == ["ValueError"]
    assert got[("raises", "save_record")] == ["NotImplementedError"]
    assert got[("default", "open_channel")] in (["8443"], ["2.5"])  # two per kind and file at most
    assert got[("docstring", "build_cli")] == ["build_cli"]
    assert got[("imports", "pkg.config")] == ["pkg/net.py"]
    assert ("where_defined", "shared") not in got  # defined twice: two right answers
    assert ("where_defined", "late_function") not in got  # only in a later commit
    assert report.dropped["ambiguous_name"] == 2 and report.dropped["syntax_error"] == 1
    assert (
        got[("default", "build_cli")] == ['"pkgtool"'] and report.dropped["guessable"] == 1
    )  # verbose=False: a guess would do


def test_build_writes_rows_whose_facts_are_in_the_code_and_split_by_file(py_repo, tmp_path):
    repo, commit = py_repo
    report = build_dataset(repo, tmp_path / "out", rev=commit, val_fraction=0.5, worked_examples=0)
    train, val = read(tmp_path / "out/train.jsonl"), read(tmp_path / "out/val.jsonl")
    assert report.train == len(train) and report.val == len(val) and report.kept > 5
    assert {r["commit"] for r in train + val} == {commit}
    assert_facts_in_code(train + val)
    train_files = {p for r in train for p in r["source_files"]}
    val_files = {p for r in val for p in r["source_files"]}
    assert not train_files & val_files
    assert all(is_held_out(p, 0.5) for p in val_files) and not any(
        is_held_out(p, 0.5) for p in train_files
    )
    for row in train + val:
        # every argument written, the closing braces left to the model
        assert row["prefill"].startswith('<tool_call>{"name": "grep"')
        assert row["prefill"] + "}}</tool_call>" == call_text(row["first_call"])
        assert "answer" not in row  # only worked examples state answers


def test_this_repositorys_own_questions_have_their_facts_in_the_code_and_no_overlap(tmp_path):
    report = build_dataset(
        ROOT,
        tmp_path,
        rev="HEAD",
        include=["agentrft/data/", "agentrft/graders/", "agentrft/tools/"],
        worked_examples=2,
    )
    train, val = read(tmp_path / "train.jsonl"), read(tmp_path / "val.jsonl")
    assert report.train > 40 and report.val > 5
    assert_facts_in_code(train + val)
    assert not {p for r in train for p in r["source_files"]} & {
        p for r in val for p in r["source_files"]
    }
    assert set(report.kinds) == {
        "where_defined",
        "returns",
        "raises",
        "docstring",
        "default",
        "imports",
    }
    examples = train[0]["messages"][:-1]
    assert all(r["messages"][:-1] == examples for r in train + val)
    asked = {r["messages"][-1]["content"] for r in train + val}
    worked = split_examples(examples)
    assert len(worked) == 2
    for question, *steps, answer in worked:
        assert question["content"] not in asked  # an example's question left the training rows
        assert answer["role"] == "assistant" and "<tool_call>" not in answer["content"]
        assert [m["role"] for m in steps] == ["assistant", "tool"] * (len(steps) // 2)
        assert all("no matches" not in m["content"] for m in steps if m["role"] == "tool")


def split_examples(messages: list[dict]) -> list[list[dict]]:
    """The worked examples, one list each: the question, its calls and outputs, the answer."""
    out: list[list[dict]] = []
    for m in messages:
        if m["role"] == "user":
            out.append([])
        out[-1].append(m)
    return out


def test_a_raises_question_becomes_a_two_call_example_grep_then_read_file(py_repo):
    """The def line alone does not show what a function raises: the example reads on from it,
    only as far as the facts, and its answer states them."""
    repo, commit = py_repo
    sources = {
        p: t for p, t in read_tree(repo, commit).items() if p.endswith(".py") and t is not None
    }
    rows = [
        q.row(repo, commit)
        for q in questions_from_code(sources, BuildReport(repo))
        if (q.kind, q.subject) == ("raises", "load_settings")
    ]
    messages, used = pick_worked_examples(rows, 1, repo)
    assert used == [0]
    question, grep, grep_out, read, read_out, answer = messages
    assert json.loads(read["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "read_file",
        "arguments": {"path": "pkg/config.py", "start_line": 7, "end_line": 10},
    }
    assert "ValueError" not in grep_out["content"] and "ValueError" in read_out["content"]
    assert read_out["content"].startswith("7:     def load_settings(")
    assert "ValueError" in answer["content"]


def test_a_users_own_rows_are_checked_by_file_and_line(py_repo, tmp_path):
    repo, commit = py_repo
    good = {
        "messages": [{"role": "user", "content": "Where does the package open sockets?"}],
        "facts": ["pkg/net.py"],
        "source_files": ["pkg/net.py"],
    }
    bad = {"messages": [{"role": "user", "content": "Anything?"}], "facts": "pkg/net.py"}
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ConfigError, match=r"own\.jsonl:3: \"facts\" must be a non-empty list"):
        load_qa_rows(own)
    own.write_text(json.dumps(good) + "\n")
    report = build_dataset(
        repo, tmp_path / "out", rev=commit, val_fraction=0.5, worked_examples=0, user_questions=own
    )
    rows = read(tmp_path / "out/train.jsonl") + read(tmp_path / "out/val.jsonl")
    mine = [r for r in rows if r["messages"][-1]["content"] == good["messages"][0]["content"]]
    assert (
        report.user_rows == 1
        and len(mine) == 1
        and mine[0]["commit"] == commit
        and mine[0]["repo"] == str(repo)
    )
    split = "val" if is_held_out("pkg/net.py", 0.5) else "train"
    assert mine[0] in read(
        tmp_path / f"out/{split}.jsonl"
    )  # with the generated questions about the same file


def test_the_command_prints_what_it_kept_and_dropped(py_repo, tmp_path, capsys):
    repo, commit = py_repo
    assert main(
        [
            "data",
            "repo-qa",
            str(repo),
            "--out",
            str(tmp_path / "o"),
            "--rev",
            commit,
            "--worked-examples",
            "0",
            "--val-fraction",
            "0.5",
        ]
    ) in (0, 1)
    out = capsys.readouterr().out
    assert (
        "Python files read" in out
        and "questions kept" in out
        and "names defined more than once" in out
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}], "facts": []}\n')
    assert (
        main(["data", "repo-qa", str(repo), "--out", str(tmp_path / "o"), "--questions", str(bad)])
        == 2
    )
    assert f"{bad}:1" in capsys.readouterr().err


def test_modules_hold_the_code_the_fixture_claims():
    assert "def load_settings" in MODULES["pkg/config.py"]
