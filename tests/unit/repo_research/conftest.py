"""Fixtures for the repository-research recipe: a small git repository of Python files (fixed
dates, no host git configuration) and fresh copies of the recipe's env.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.git_repos import git
from tests.unit.recipe_env import load_fresh

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "agentrft" / "tasks" / "repo_research"

MODULES = {
    "pkg/__init__.py": "",
    "pkg/config.py": '''import json


class Settings:
    """Settings read from a JSON file on disk."""

    def load_settings(self, path: str, retries: int = 3) -> dict[str, int]:
        """Read the settings file and return its numbers by name."""
        if retries < 0:
            raise ValueError("retries must not be negative")
        return json.loads(open(path).read())
''',
    "pkg/net.py": '''import socket
from pkg.config import Settings


def open_channel(host: str, port: int = 8443, *, timeout: float = 2.5) -> socket.socket:
    """Open a TCP channel to the host with a timeout in seconds."""
    if not host:
        raise ConnectionError("no host")
    return socket.create_connection((host, port), timeout)


def shared(x):
    return x
''',
    "pkg/store.py": '''def shared(x):
    return x


def save_record(record: dict, table: str = "records") -> list[str]:
    """Write one record to the named table and return its keys."""
    raise NotImplementedError
''',
    "tools/cli.py": '''import argparse


def build_cli(prog: str = "pkgtool", verbose: bool = False) -> argparse.ArgumentParser:
    """Build the command line parser of the package tool."""
    return argparse.ArgumentParser(prog=prog)
''',
    "broken.py": "def nope(:\n",
}


@pytest.fixture
def py_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository of a few Python modules; returns (path, commit). A later commit adds
    `pkg/late.py`, which the rows' commit does not hold."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for rel, text in MODULES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "code")
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "pkg/late.py").write_text("def late_function():\n    return 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    return repo, commit


@pytest.fixture
def load_env_module() -> Callable[[], ModuleType]:
    """Loads a fresh copy of recipes/repo_research/env.py (its own ToolServer)."""
    return lambda: load_fresh(RECIPE / "env.py")
