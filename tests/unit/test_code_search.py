"""The ranked code search: word splitting, ranking by path and content, numbered output, and
indexing a git revision without checking it out."""

from __future__ import annotations

import os

import pytest

from agentrft.tools.code_search import CodeIndex, numbered, words
from tests.unit.git_repos import git


def test_words_split_identifiers_and_drop_stopwords():
    assert words("Fix parse_log in BM25Okapi for the StopReason") == [
        "parse_log",
        "parse",
        "log",
        "bm25okapi",
        "bm",
        "25",
        "okapi",
        "stopreason",
        "stop",
        "reason",
    ]
    assert words("a b the of") == []


def test_path_words_and_identifiers_rank_the_right_file_first():
    index = CodeIndex(
        {
            "src/auth/login.py": "def check_password(user, password):\n    return hash(password) == user.hash\n",
            "src/billing/invoice.py": "def total(items):\n    return sum(i.price for i in items)\n",
            "docs/index.md": "Welcome. Login and billing are documented here.\n",
            "logo.png": None,  # binary: indexed by its path only
        }
    )
    hits = index.search("Reject a wrong password at login")
    assert hits[0].path == "src/auth/login.py"
    assert "password" in hits[0].matched and "login" in hits[0].matched
    assert index.search("invoice total")[0].path == "src/billing/invoice.py"
    assert index.search("logo")[0].path == "logo.png"


def test_files_matching_no_query_word_are_left_out():
    index = CodeIndex({"a.py": "alpha\n", "b.py": "beta\n", "c.py": "gamma\n"})
    assert [h.path for h in index.search("beta", k=5)] == ["b.py"]
    assert index.search("") == [] and index.search("the of") == []
    assert CodeIndex({}).search("anything") == []


def test_numbered_output_puts_the_path_after_its_number():
    index = CodeIndex({"src/app.py": "def main(): pass\n", "README.md": "run main\n"})
    lines = numbered(index.search("main app")).splitlines()
    assert lines[0].startswith("1. src/app.py  (matches: ")
    assert lines[1].startswith("2. README.md")


def test_from_git_indexes_the_revision_not_the_work_tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "old.py").write_text("def shiny_widget(): pass\n")
    (repo / "data.bin").write_bytes(b"\x00\x01shiny")
    os.symlink("old.py", repo / "link.py")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    rev = git(repo, "rev-parse", "HEAD")
    (repo / "old.py").write_text("nothing here\n")
    (repo / "new.py").write_text("def shiny_widget(): pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two")
    index = CodeIndex.from_git(repo, rev)
    assert index.paths == ["data.bin", "old.py"]  # the symlink is left out; new.py came later
    assert [h.path for h in index.search("shiny widget")] == ["old.py"]
    with pytest.raises(RuntimeError, match="ls-tree"):
        CodeIndex.from_git(repo, "0" * 40)


def test_from_dir_reads_files_under_a_root(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def frobnicate(): pass\n")
    index = CodeIndex.from_dir(tmp_path)
    assert index.paths == ["pkg/mod.py"]
    assert index.search("frobnicate")[0].path == "pkg/mod.py"
