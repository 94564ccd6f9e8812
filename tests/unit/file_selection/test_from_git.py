"""`agentrft data from-git`: rows, filters, drop reasons and the time split, on a repository
built commit by commit in a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.cli import main
from agentrft.data import load_dataset
from agentrft.tasks.file_selection.dataset import build_dataset, parse_log, split_by_time


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def history(make_repo):
    """A history with one commit for each case; returns (repo, {label: sha})."""
    r = make_repo()
    sha = {}
    r.write("a.py", "print('a')\n" * 20)
    r.write("b.py", "b = 1\n")
    r.write("docs/x.md", "# docs\n")
    r.write("bin.dat", b"\x00\x01\x02binary")
    r.write("package-lock.json", "{}\n")
    r.write("vendor/lib.js", "lib\n")
    sha["root"] = r.commit("Initial import")
    r.git("mv", "a.py", "c.py")
    sha["rename"] = r.commit("Rename a to c\n\nThe module is called c now.")
    r.remove("b.py")
    sha["delete"] = r.commit("Remove b")
    r.write("bin.dat", b"\x00\x09\x09changed")
    r.write("ünïcode dir/файл.py", "x = 'ü'\n")
    sha["binary_unicode"] = r.commit("Update blob and add ünïcode module ✓")
    r.write("docs/x.md", "# docs\nmore\n")
    sha["empty_message"] = r.commit("")
    for i in range(9):
        r.write(f"many/f{i}.py", f"{i}\n")
    sha["too_many"] = r.commit("Add nine files")
    r.write("package-lock.json", '{"v": 2}\n')
    r.write("vendor/lib.js", "lib 2\n")
    sha["locks_only"] = r.commit("Bump dependencies")
    r.write("package-lock.json", '{"v": 3}\n')
    r.write("c.py", "print('c')\n")
    sha["lock_and_code"] = r.commit("Use c in c.py")
    r.git("checkout", "-q", "-b", "side")
    r.write("s.py", "s = 1\n")
    sha["side"] = r.commit("Side change")
    r.git("checkout", "-q", "main")
    r.minute += 1
    r.git("merge", "-q", "--no-ff", "side", "-m", "Merge side")
    sha["merge"] = r.git("rev-parse", "HEAD")
    r.write("docs/x.md", "# docs\nfixed\n")
    sha["docs"] = r.commit("Fix docs\n\nweird\tchars \x1e and \u2028 kept")
    sha["empty_commit"] = r.commit("Nothing changed", allow_empty=True)
    return r, sha


def test_rows_drops_and_time_split(history, tmp_path):
    repo, sha = history
    report = build_dataset(
        repo.path,
        tmp_path / "out",
        val_fraction=0.5,
        worked_examples=0,
        keep_new_only=True,
        keep_unfound=True,
    )
    train = read_rows(tmp_path / "out" / "train.jsonl")
    val = read_rows(tmp_path / "out" / "val.jsonl")

    assert report.seen == 12
    assert dict(report.dropped) == {
        "merge": 1,
        "root_commit": 1,
        "empty_message": 1,
        "no_files": 1,
        "no_files_left": 1,
        "too_many_files": 1,
    }
    assert report.files_excluded == 1  # package-lock.json of "Use c in c.py"
    # oldest first; the newest half is validation (future changes)
    assert [r["commit"] for r in train] == [sha["rename"], sha["delete"], sha["binary_unicode"]]
    assert [r["commit"] for r in val] == [sha["lock_and_code"], sha["side"], sha["docs"]]

    rows = {r["commit"]: r for r in train + val}
    assert rows[sha["rename"]]["files"] == ["c.py"]
    assert rows[sha["rename"]]["renamed_from"] == {"c.py": "a.py"}
    assert rows[sha["rename"]]["messages"] == [
        {"role": "user", "content": "Rename a to c\n\nThe module is called c now."}
    ]
    assert rows[sha["delete"]]["files"] == ["b.py"]
    assert rows[sha["binary_unicode"]]["files"] == ["bin.dat", "ünïcode dir/файл.py"]
    assert (
        rows[sha["binary_unicode"]]["messages"][0]["content"]
        == "Update blob and add ünïcode module ✓"
    )
    assert rows[sha["lock_and_code"]]["files"] == ["c.py"]
    assert rows[sha["side"]]["parent"] == sha["lock_and_code"]
    assert (
        "\x1e" in rows[sha["docs"]]["messages"][0]["content"]
        and "\u2028" in rows[sha["docs"]]["messages"][0]["content"]
    )
    for row in train + val:
        assert row["repo"] == str(repo.path.resolve())
        assert row["parent"] == repo.git("rev-parse", row["commit"] + "^")
        assert row["renamed_from"] == {} or row["commit"] == sha["rename"]
    # the files load as agentrft datasets, item fields intact
    items = load_dataset(tmp_path / "out" / "train.jsonl")
    assert items[0].fields["files"] == ["c.py"] and items[0].messages[-1]["role"] == "user"


def test_filters_and_limits(history, tmp_path):
    repo, sha = history
    report = build_dataset(
        repo.path,
        tmp_path / "a",
        max_files=9,
        default_excludes=False,
        val_fraction=0,
        worked_examples=0,
        keep_new_only=True,
        keep_unfound=True,
    )
    rows = {r["commit"]: r for r in read_rows(tmp_path / "a" / "train.jsonl")}
    assert len(rows[sha["too_many"]]["files"]) == 9
    assert rows[sha["locks_only"]]["files"] == ["package-lock.json", "vendor/lib.js"]
    assert rows[sha["lock_and_code"]]["files"] == ["c.py", "package-lock.json"]
    assert report.val == 0 and (tmp_path / "a" / "val.jsonl").read_text() == ""

    report = build_dataset(
        repo.path,
        tmp_path / "b",
        include=["docs/", "*.py"],
        exclude=["many/", "c.py"],
        worked_examples=0,
        keep_new_only=True,
        keep_unfound=True,
    )
    rows_b = read_rows(tmp_path / "b" / "train.jsonl") + read_rows(tmp_path / "b" / "val.jsonl")
    assert sorted(f for r in rows_b for f in r["files"]) == [
        "b.py",
        "docs/x.md",
        "s.py",
        "ünïcode dir/файл.py",
    ]
    assert report.dropped["no_files_left"] == 4  # rename (c.py), nine files, locks, lock+c.py


def test_non_utf8_path_is_counted_not_crashed(make_repo, tmp_path):
    r = make_repo()
    r.write("a.txt")
    r.commit("root")
    r.write(b"bad\xffname.txt")
    r.commit("Add a file with a Latin-1 name")
    r.write("a.txt", "y\n")
    r.commit("Change a")
    report = build_dataset(
        r.path, tmp_path / "out", val_fraction=0, worked_examples=0, keep_unfound=True
    )
    assert report.dropped["non_utf8_path"] == 1 and report.kept == 1


def test_split_is_by_time_not_by_listing_order():
    rows = [
        (300, {"n": "c"}),
        (100, {"n": "a"}),
        (200, {"n": "b"}),
        (400, {"n": "d"}),
        (500, {"n": "e"}),
    ]
    train, val = split_by_time(rows, 0.2)
    assert [r["n"] for r in train] == ["a", "b", "c", "d"] and [r["n"] for r in val] == ["e"]
    train, val = split_by_time(rows[:2], 0.01)  # two rows: each side gets one
    assert len(train) == len(val) == 1
    assert split_by_time(rows[:1], 0.5) == ([{"n": "c"}], [])


def test_parse_log_handles_renames_and_separators():
    data = (
        b"\x1e" + b"a" * 40 + b"\0" + b"b" * 40 + b"\0" + b"17\0subject\n\nbody\0\0\n"
        b"R087\0old name\0new\nname\0D\0gone\0M\0bin.dat\0"
        b"\x1e" + b"b" * 40 + b"\0\0" + b"16\0\0\0\nA\0first\0"
    )
    newest, root = parse_log(data)
    assert (
        newest.message == "subject\n\nbody" and newest.parents == ("b" * 40,) and newest.time == 17
    )
    assert [(c.status, c.path, c.old_path) for c in newest.changes] == [
        ("R", b"new\nname", b"old name"),
        ("D", b"gone", None),
        ("M", b"bin.dat", None),
    ]
    assert (
        root.parents == () and root.message == "" and [c.path for c in root.changes] == [b"first"]
    )


def test_cli_prints_summary_and_writes_files(history, tmp_path, capsys):
    repo, _ = history
    out = tmp_path / "cli"
    assert (
        main(
            [
                "data",
                "from-git",
                str(repo.path),
                "--out",
                str(out),
                "--max-files",
                "9",
                "--keep-new-only",
                "--keep-unfound",
                "--worked-examples",
                "0",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "12 commits read, 7 kept" in printed
    assert "merge commit" in printed and "empty commit message" in printed
    assert "root commit" in printed and "every changed file excluded" in printed
    assert (out / "train.jsonl").is_file() and (out / "val.jsonl").is_file()


def test_cli_refuses_a_directory_that_is_not_a_repository(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert main(["data", "from-git", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "git rev-parse" in capsys.readouterr().err


def test_bad_path_pattern_is_a_config_error(history, tmp_path, capsys):
    repo, _ = history
    assert (
        main(["data", "from-git", str(repo.path), "--out", str(tmp_path / "o"), "--exclude", "!"])
        == 2
    )
    assert "'!' is not valid gitignore syntax" in capsys.readouterr().err


def test_commits_that_only_add_files_are_dropped_as_nothing_to_find(history, tmp_path):
    repo, sha = history
    report = build_dataset(
        repo.path,
        tmp_path / "out",
        max_files=9,
        val_fraction=0,
        worked_examples=0,
        keep_unfound=True,
    )
    kept = {r["commit"] for r in read_rows(tmp_path / "out" / "train.jsonl")}
    assert (
        report.dropped["nothing_to_find"] == 3
    )  # nine new files; the side branch's new s.py; a rename's new path
    assert sha["too_many"] not in kept and sha["side"] not in kept and sha["rename"] not in kept
    assert sha["binary_unicode"] in kept  # it adds a module, but it changes bin.dat too
    assert any("only adds files" in line for line in report.lines())


@pytest.fixture
def searchable(make_repo):
    """A small project whose commit subjects name what they change."""
    r = make_repo()
    r.write("src/login.py", "def check_password(user, password):\n    return True\n")
    r.write("src/invoice.py", "def invoice_total(items):\n    return 0\n")
    r.write("src/cart.py", "def add_to_cart(cart, item):\n    cart.append(item)\n")
    r.write("README.md", "A shop.\n")
    r.commit("Initial import")
    changes = [
        ("src/login.py", "Login: check the password"),
        ("src/invoice.py", "Invoice total: sum the items"),
        ("src/cart.py", "Cart: refuse a duplicate item"),
        ("src/login.py", "Login: lock after three tries"),
        ("README.md", "README: say what the shop sells"),
        ("src/invoice.py", "Invoice: round the total"),
    ]
    for i, (path, message) in enumerate(changes):
        r.write(path, f"# change {i}\n" + (r.path / path).read_text())
        r.commit(message)
    return r


def test_worked_examples_come_from_training_commits_and_start_every_row(searchable, tmp_path):
    report = build_dataset(searchable.path, tmp_path / "out", val_fraction=0.34)
    train, val = (
        read_rows(tmp_path / "out" / "train.jsonl"),
        read_rows(tmp_path / "out" / "val.jsonl"),
    )
    assert (
        len(report.examples) == 2
        and report.train == len(train) == 2
        and report.val == len(val) == 2
    )
    shots = val[0]["messages"][:-1]
    assert len(shots) == 8 and all(row["messages"][:-1] == shots for row in train + val)
    example_commits = set(report.examples)
    assert not example_commits & {
        row["commit"] for row in train + val
    }  # an example is never a task
    log = searchable.git("log", "--format=%H %s").splitlines()
    subjects = dict(line.split(" ", 1) for line in log)
    for k, commit in zip(range(0, 8, 4), report.examples, strict=True):
        request, call, output, answer = shots[k : k + 4]
        assert request["content"] == subjects[commit]
        assert (
            json.loads(call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))[
                "arguments"
            ]["query"]
            == subjects[commit]
        )
        lines = output["content"].splitlines()
        assert lines[0].startswith("1. ")
        changed = searchable.git("show", "--format=", "--name-only", commit).split()
        picked = json.loads(answer["content"])
        assert picked and all(lines[n - 1].split()[1] in changed for n in picked)
    answered = [searchable.git("show", "--format=", "--name-only", c) for c in report.examples]
    assert len(set(answered)) == 2  # the two examples answer with different files
    assert "worked examples" in "\n".join(report.lines())


def test_no_worked_examples_when_asked_for_none(searchable, tmp_path):
    report = build_dataset(searchable.path, tmp_path / "out", val_fraction=0.34, worked_examples=0)
    rows = read_rows(tmp_path / "out" / "train.jsonl")
    assert (
        report.examples == [] and all(len(r["messages"]) == 1 for r in rows) and report.train == 4
    )


def test_training_commits_the_search_cannot_find_are_dropped_but_never_validation_ones(
    searchable, tmp_path
):
    searchable.write("src/cart.py", "# tidy\n" + (searchable.path / "src/cart.py").read_text())
    unfound = searchable.commit("Tidy up")  # no word of it names the file
    searchable.write(
        "src/invoice.py", "# tidy\n" + (searchable.path / "src/invoice.py").read_text()
    )
    held_out = searchable.commit("Tidy up again")
    searchable.write("README.md", "A shop that sells carts.\n")
    searchable.commit("README: what the shop sells")
    report = build_dataset(searchable.path, tmp_path / "out", val_fraction=0.2, worked_examples=0)
    train = {r["commit"] for r in read_rows(tmp_path / "out" / "train.jsonl")}
    val = {r["commit"] for r in read_rows(tmp_path / "out" / "val.jsonl")}
    assert report.dropped["not_found_by_search"] == 1 and unfound not in train | val
    assert held_out in val  # unfindable too, but held-out rows are never chosen by their answer
    kept = build_dataset(
        searchable.path, tmp_path / "all", val_fraction=0.2, worked_examples=0, keep_unfound=True
    )
    assert kept.train == report.train + 1


def test_each_row_starts_its_reply_as_a_search_for_its_subject(searchable, tmp_path):
    build_dataset(searchable.path, tmp_path / "out", val_fraction=0.34)
    for row in read_rows(tmp_path / "out" / "train.jsonl") + read_rows(
        tmp_path / "out" / "val.jsonl"
    ):
        subject = row["messages"][-1]["content"].splitlines()[0]
        assert row["prefill"] == '<tool_call>{"name": "search", "arguments": {"query": "' + subject
    build_dataset(searchable.path, tmp_path / "none", val_fraction=0.34, prefill_query=False)
    assert all("prefill" not in r for r in read_rows(tmp_path / "none" / "train.jsonl"))
