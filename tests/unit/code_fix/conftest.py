"""Fixtures for the code-fix recipe: a tiny Python project with its own tests in a git
repository, the dataset `agentrft data code-fix` builds from it (every bug kind, no cap), the
recipe's environment served on loopback, and scripted rollouts graded by the job's own
`multi` grader over HTTP."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

RECIPE = Path(__file__).resolve().parents[3] / "agentrft" / "tasks" / "code_fix"

CORE = '''\
"""Small arithmetic helpers."""


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def total(values):
    s = 0
    for v in values:
        s = s + v
    return s


def is_even(n):
    return n % 2 == 0


def first_word(text):
    words = text.split()
    if not words:
        return ""
    return words[0]


def untested(a, b):
    return a < b
'''

TEXT = '''\
"""Text helpers."""


def shout(text, times):
    return text.upper() + "!" * times


def initials(name):
    return "".join(part[0] for part in name.split() if part)
'''

TEST_CORE = """\
from calc.core import clamp, first_word, is_even, total


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6


def test_total_empty():
    assert total([]) == 0


def test_even():
    assert is_even(4)


def test_odd():
    assert not is_even(3)


def test_first_word():
    assert first_word("hello big world") == "hello"


def test_first_word_empty():
    assert first_word("   ") == ""
"""

TEST_TEXT = """\
from calc.text import initials, shout


def test_shout():
    assert shout("hi", 2) == "HI!!"


def test_initials():
    assert initials("ada lovelace") == "al"
"""

CONFTEST = '"""Shared test setup (none yet)."""\n'


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": "@1700000000 +0000",
        "GIT_COMMITTER_DATE": "@1700000000 +0000",
    }
    out = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, check=True)
    return out.stdout.decode().strip()


def make_project(root: Path) -> str:
    """The tiny project as a git repository at `root`; returns its commit."""
    files = {
        "calc/__init__.py": "",
        "calc/core.py": CORE,
        "calc/text.py": TEXT,
        "tests/__init__.py": "",
        "tests/conftest.py": CONFTEST,
        "tests/test_core.py": TEST_CORE,
        "tests/test_text.py": TEST_TEXT,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "calc")
    return git(root, "rev-parse", "HEAD")


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calc-project")
    make_project(root)
    return root


@pytest.fixture(scope="session")
def dataset(project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every bug the builder can inject into the project and its tests catch."""
    from agentrft.tasks.code_fix.dataset import build_dataset

    out = tmp_path_factory.mktemp("calc-data")
    report = build_dataset(project, out, max_per_file=100, max_per_function=100)
    rows = [
        json.loads(line)
        for name in ("train", "val")
        for line in (out / f"{name}.jsonl").read_text().splitlines()
    ]
    return {"report": report, "rows": rows, "out": out}


def row_for(dataset: dict[str, Any], function: str, kind: str, after: str) -> dict[str, Any]:
    """The row whose bug is `kind` in `function`, turning its line into `after` (stripped)."""
    for row in dataset["rows"]:
        m = row["mutation"]
        if (m["function"], m["kind"], m["after"].strip()) == (function, kind, after):
            return dict(row)
    raise AssertionError(
        f"no {kind} row for {function}: {[r['mutation'] for r in dataset['rows']]}"
    )


def load_env() -> ModuleType:
    """A fresh copy of the recipe's env.py (its own ToolServer and state)."""
    spec = importlib.util.spec_from_file_location(
        f"code_fix_env_{uuid.uuid4().hex}", RECIPE / "env.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def env_url() -> Iterator[str]:
    from agentrft.tools.envkit import serve_in_thread

    with serve_in_thread(load_env().app) as url:
        yield url


@dataclass
class Rollout:
    """One scripted rollout against the served environment: tool calls, then its grade by
    the job's own grader (pointed at the served environment)."""

    url: str
    item: dict[str, Any]
    trace_id: str = ""

    def __post_init__(self) -> None:
        self.trace_id = f"trace_{uuid.uuid4().hex}"

    def call(self, name: str, **args: Any) -> tuple[int, str]:
        reply = httpx.post(
            f"{self.url}/tools/{name}",
            json={
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": name,
                "arguments": json.dumps(args),
                "trace_id": self.trace_id,
                "item": self.item,
            },
            timeout=300,
        )
        if reply.status_code == 200:
            return 200, reply.json()["output"]
        return reply.status_code, reply.text

    def grade(self, answer: str = "Fixed the comparison.") -> Any:
        from agentrft.graders import build_grader, sample_from_text
        from agentrft.job import load_job

        spec = json.loads(
            json.dumps(load_job(RECIPE / "job.yaml").rl.grader).replace(
                "http://127.0.0.1:8741", self.url
            )
        )
        grade = build_grader(spec).grade(sample_from_text(answer), self.item, self.trace_id)
        httpx.post(f"{self.url}/cleanup", json={"trace_id": self.trace_id}, timeout=30)
        return grade
