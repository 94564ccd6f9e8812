"""The file-selection environment over real loopback HTTP: per-trace workspaces of the parent
commit, confinement, the three tools, the endpoint grader and cleanup."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from agentrft.tools import repo_workspace
from agentrft.tools.envkit import serve_in_thread
from tests.unit.recipe_env import post_tool_call as call


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("do not read\n")
    return secret


@pytest.fixture
def repo_item(make_repo, outside: Path) -> dict:
    """A repository whose HEAD differs from the parent commit the rollout must see."""
    r = make_repo()
    r.write("a.txt", "root version\n")
    r.write("src/main.py", "import os\n\n\ndef parse(text):\n    return text.split()\n")
    r.write("src/util/strings.py", "def parse_words(s):\n    return s\n")
    r.write("blob.bin", b"\x00\x01parse")
    r.commit("root")
    os.symlink(outside, r.path / "escape")
    os.symlink(outside / "secret.txt", r.path / "secret_link")
    os.symlink("src/main.py", r.path / "inside_link")
    r.write("a.txt", "parent version\n" + "".join(f"line {i}\n" for i in range(2, 301)))
    parent = r.commit("Parent: links and a longer a.txt")
    r.write("a.txt", "head version\n")
    r.write("new.txt", "only at HEAD\n")
    head = r.commit("Change a.txt and add new.txt")
    return {
        "repo": str(r.path),
        "commit": head,
        "parent": parent,
        "files": ["a.txt", "new.txt"],
        "renamed_from": {},
    }


@pytest.fixture
def workspaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = tmp_path / "workspaces"
    base.mkdir()
    monkeypatch.setenv("AGENTRFT_WORKSPACE_DIR", str(base))
    return base


@pytest.fixture
def env_module(workspaces: Path, load_env_module) -> ModuleType:
    return load_env_module()


@pytest.fixture
def server(env_module: ModuleType):
    with serve_in_thread(env_module.app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def output(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["type"] == "function_call_output"
    return body["output"]


def workspace_of(workspaces: Path, trace_id: str) -> Path:
    (found,) = workspaces.glob(f"agentrft-ws-{trace_id}-*")
    return found


def test_workspace_is_the_parent_commit_not_head(server, repo_item):
    assert (
        output(call(server, "trace_a", repo_item, "read_file", path="a.txt", end_line=1))
        == "1: parent version\n... (300 lines in all; continue with start_line=2)"
    )
    missing = call(server, "trace_a", repo_item, "read_file", path="new.txt")
    assert missing.status_code == 400 and "no such file" in missing.text
    assert "new.txt" not in output(call(server, "trace_a", repo_item, "list_files"))


def test_concurrent_rollouts_have_separate_workspaces(server, repo_item, workspaces):
    with ThreadPoolExecutor(2) as pool:
        listings = list(
            pool.map(
                lambda t: output(call(server, t, repo_item, "list_files")), ["trace_a", "trace_b"]
            )
        )
    assert listings[0] == listings[1] and "src/main.py" in listings[0]
    ws_a, ws_b = workspace_of(workspaces, "trace_a"), workspace_of(workspaces, "trace_b")
    assert ws_a != ws_b
    (ws_a / "scratch.txt").write_text("written in a\n")
    (ws_a / "a.txt").write_text("changed in a\n")
    assert (
        output(call(server, "trace_a", repo_item, "read_file", path="scratch.txt"))
        == "1: written in a"
    )
    assert call(server, "trace_b", repo_item, "read_file", path="scratch.txt").status_code == 400
    assert output(
        call(server, "trace_b", repo_item, "read_file", path="a.txt", end_line=1)
    ).startswith("1: parent version")


@pytest.mark.parametrize(
    "tool,args",
    [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "src/../../outside/secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "escape/secret.txt"}),
        ("read_file", {"path": "secret_link"}),
        ("list_files", {"path": "escape"}),
        ("grep", {"pattern": "read", "path": "escape"}),
        ("grep", {"pattern": "read", "path": ".."}),
    ],
)
def test_paths_outside_the_workspace_are_refused(server, repo_item, tool, args):
    resp = call(server, "trace_a", repo_item, tool, **args)
    assert resp.status_code == 400, resp.text
    assert "do not read" not in resp.text


def test_symlinks_inside_the_workspace_work_and_grep_skips_escaping_ones(server, repo_item):
    assert (
        output(call(server, "t", repo_item, "read_file", path="inside_link", end_line=1))
        == "1: import os\n... (5 lines in all; continue with start_line=2)"
    )
    assert "do not read" not in output(call(server, "t", repo_item, "grep", pattern="not read"))


def test_grep(server, repo_item, env_module, monkeypatch):
    assert output(call(server, "t", repo_item, "grep", pattern=r"def parse\w*")) == (
        "inside_link:4: def parse(text):\nsrc/main.py:4: def parse(text):\nsrc/util/strings.py:1: def parse_words(s):"
    )
    assert (
        output(call(server, "t", repo_item, "grep", pattern="PARSE_", ignore_case=True, path="src"))
        == "src/util/strings.py:1: def parse_words(s):"
    )
    assert (
        output(call(server, "t", repo_item, "grep", pattern="def", path="src", glob="util/*.py"))
        == "src/util/strings.py:1: def parse_words(s):"
    )
    assert output(call(server, "t", repo_item, "grep", pattern="def", glob="util/*.py")).startswith(
        "no matches"
    )  # anchored at `path`
    assert output(call(server, "t", repo_item, "grep", pattern="nothing like this")).startswith(
        "no matches"
    )
    bad = call(server, "t", repo_item, "grep", pattern="def (")
    assert bad.status_code == 400 and "bad regular expression" in bad.text
    bad = call(server, "t", repo_item, "grep", pattern="def", glob="\\")
    assert bad.status_code == 400 and "bad glob" in bad.text
    assert call(server, "t", repo_item, "list_files", pattern=5).status_code == 400
    monkeypatch.setattr(repo_workspace, "GREP_MAX_MATCHES", 3)
    capped = output(call(server, "t", repo_item, "grep", pattern="^line"))
    assert capped.splitlines()[:3] == ["a.txt:2: line 2", "a.txt:3: line 3", "a.txt:4: line 4"]
    assert "more than 3 matches" in capped.splitlines()[3]


def test_grep_files_only_lists_each_matching_file_once(server, repo_item, env_module, monkeypatch):
    assert (
        output(call(server, "t", repo_item, "grep", pattern=r"def|return", files_only=True))
        == "inside_link\nsrc/main.py\nsrc/util/strings.py"
    )
    assert output(call(server, "t", repo_item, "grep", pattern="^line", files_only=True)) == "a.txt"
    monkeypatch.setattr(repo_workspace, "GREP_MAX_MATCHES", 2)
    capped = output(call(server, "t", repo_item, "grep", pattern=r"def|return", files_only=True))
    assert capped.splitlines() == [
        "inside_link",
        "src/main.py",
        "(more than 2 files; narrow with `path`, `glob` or a longer pattern)",
    ]


def test_grep_line_numbers_agree_with_read_file(server, repo_item, workspaces):
    output(call(server, "t", repo_item, "list_files"))  # creates the workspace
    (workspace_of(workspaces, "t") / "odd.txt").write_bytes(
        b"one\x0cstill one\r\ntwo target\r\nthree\n"
    )
    assert (
        output(call(server, "t", repo_item, "grep", pattern="target$", path="odd.txt"))
        == "odd.txt:2: two target"
    )
    assert (
        output(call(server, "t", repo_item, "read_file", path="odd.txt", start_line=2))
        == "2: two target\n3: three"
    )


def test_grep_patterns_that_only_match_within_a_line(server, repo_item):
    expected = "inside_link:4: def parse(text):\nsrc/main.py:4: def parse(text):"
    assert output(call(server, "t", repo_item, "grep", pattern=r"\(text\):\Z")) == expected
    assert output(call(server, "t", repo_item, "grep", pattern=r"\(text\):(?!\n)")) == expected
    assert (
        output(call(server, "t", repo_item, "grep", pattern=r"\A\s+return text"))
        == "inside_link:5: return text.split()\nsrc/main.py:5: return text.split()"
    )


def test_grep_stops_a_runaway_pattern(server, repo_item, env_module, monkeypatch, workspaces):
    monkeypatch.setattr(repo_workspace, "GREP_TIME_LIMIT_S", 0.3)
    output(call(server, "t", repo_item, "list_files"))  # creates the workspace
    (workspace_of(workspaces, "t") / "long.txt").write_text("a" * 60 + "b\n")
    out = output(call(server, "t", repo_item, "grep", pattern=r"(a|aa)+$", path="long.txt"))
    assert "search stopped after 0.3s" in out


def test_list_files_glob_and_cap(server, repo_item, env_module, monkeypatch):
    assert (
        output(call(server, "t", repo_item, "list_files", pattern="*.py"))
        == "src/main.py\nsrc/util/strings.py"
    )
    assert (
        output(call(server, "t", repo_item, "list_files", path="src/util")) == "src/util/strings.py"
    )
    assert call(server, "t", repo_item, "list_files", path="nope").status_code == 400
    monkeypatch.setattr(repo_workspace, "LIST_MAX_FILES", 2)
    assert (
        output(call(server, "t", repo_item, "list_files"))
        .splitlines()[-1]
        .startswith("... and 4 more files")
    )


def test_read_file_ranges_and_errors(server, repo_item, env_module):
    assert (
        output(call(server, "t", repo_item, "read_file", path="a.txt", start_line=299))
        == "299: line 299\n300: line 300"
    )
    first_page = output(call(server, "t", repo_item, "read_file", path="a.txt")).splitlines()
    limit = repo_workspace.READ_MAX_LINES
    assert (
        len(first_page) == limit + 1
        and first_page[-1] == f"... (300 lines in all; continue with start_line={limit + 1})"
    )
    assert "binary" in output(call(server, "t", repo_item, "read_file", path="blob.bin"))
    for args in (
        {"path": "src"},
        {"path": "a.txt", "start_line": 999},
        {"path": "a.txt", "start_line": "x"},
        {"path": "a.txt", "start_line": 5, "end_line": 2},
        {"nope": 1},
    ):
        assert call(server, "t", repo_item, "read_file", **args).status_code == 400, args


def test_grading_scores_file_f1_and_removes_the_workspace(server, repo_item, workspaces):
    output(call(server, "trace_g", repo_item, "list_files"))
    assert workspace_of(workspaces, "trace_g").is_dir()
    sample = {"output_text": '["a.txt", "src/main.py"]'}
    resp = server.post("/grade", json={"sample": sample, "item": repo_item, "trace_id": "trace_g"})
    assert resp.status_code == 200 and resp.json() == {"score": pytest.approx(0.5)}
    assert list(workspaces.iterdir()) == []


def test_grading_without_tool_calls_makes_no_workspace(server, repo_item, workspaces):
    sample = {"output_text": "new.txt\na.txt"}
    resp = server.post(
        "/grade", json={"sample": sample, "item": repo_item, "trace_id": "trace_direct"}
    )
    assert resp.json() == {"score": 1.0}
    assert list(workspaces.iterdir()) == []


def test_cleanup_and_idle_ttl_remove_workspaces(server, repo_item, workspaces, env_module):
    output(call(server, "trace_c", repo_item, "list_files"))
    assert server.post("/cleanup", json={"trace_id": "trace_c"}).json() == {"removed": True}
    assert list(workspaces.iterdir()) == []
    output(call(server, "trace_old", repo_item, "list_files"))
    env_module.env.idle_ttl_s = 0.0  # the next call sweeps every idle trace
    output(call(server, "trace_new", repo_item, "list_files"))
    assert [p.name.split("-")[2] for p in workspaces.iterdir()] == ["trace_new"]


def test_an_unusable_item_is_a_server_error_not_the_models(server, repo_item):
    resp = call(server, "t", {**repo_item, "parent": "not-a-sha"}, "list_files")
    assert resp.status_code == 500


@pytest.mark.parametrize(
    "answer,score",
    [
        ('["a.txt", "new.txt"]', 1.0),
        ('```json\n["./a.txt"]\n```', 2 / 3),
        ("- `a.txt`\n- new.txt\n", 1.0),
        ("1. a.txt\n2. other.py", 0.5),
        ("", 0.0),
        ("[]", 0.0),
    ],
)
def test_answer_parsing_and_f1(env_module, answer, score):
    assert env_module.file_f1(
        env_module.parse_paths(answer), ["a.txt", "new.txt"]
    ) == pytest.approx(score)


def test_f1_of_two_empty_sets_is_one(env_module):
    assert env_module.file_f1([], []) == 1.0


def test_search_ranks_the_parent_commits_files_and_numbers_them(server, repo_item, workspaces):
    out = output(call(server, "trace_s", repo_item, "search", query="parse words"))
    lines = out.splitlines()
    assert lines[0].startswith(
        "1. src/util/strings.py  (matches: parse, words"
    )  # path and identifier parse_words
    assert any(line.startswith("2. src/main.py") for line in lines)
    assert (
        "new.txt" not in out and "do not read" not in out
    )  # HEAD's file and the symlinked secret are not indexed
    assert list(workspaces.iterdir()) == []  # the index is read from git: no workspace for a search
    assert (
        output(call(server, "trace_s", repo_item, "search", query="zebra"))
        == "no files match 'zebra'; try other words"
    )
    empty = call(server, "trace_s", repo_item, "search", query="  ")
    assert empty.status_code == 400 and "non-empty" in empty.text


def test_a_symlink_loop_is_a_400_naming_the_models_path_not_the_workspace(
    server, make_repo, workspaces
):
    r = make_repo("loops")
    r.write("a.txt", "a\n")
    os.symlink("loop_b", r.path / "loop_a")
    os.symlink("loop_a", r.path / "loop_b")
    parent = r.commit("root with a loop")
    r.write("a.txt", "b\n")
    head = r.commit("change")
    item = {"repo": str(r.path), "commit": head, "parent": parent, "files": ["a.txt"]}
    resp = call(server, "trace_loop", item, "read_file", path="loop_a/x.txt")
    assert resp.status_code == 400, resp.text
    assert "loop_a/x.txt" in resp.text and str(workspaces) not in resp.text
