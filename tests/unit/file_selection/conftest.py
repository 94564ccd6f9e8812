"""Fixtures for the file-selection recipe: a tiny git repository that tests build commit by
commit (fixed dates, no host git configuration), and fresh copies of the recipe's env.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.git_repos import T0, git
from tests.unit.recipe_env import load_fresh

RECIPE = Path(__file__).resolve().parents[3] / "agentrft" / "tasks" / "file_selection"


class GitRepo:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.minute = 0
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str | bytes) -> str:
        # commit times are T0 + minutes, so the time split is deterministic
        return git(self.path, *args, when=T0 + 60 * self.minute)

    def write(self, rel: str | bytes, content: str | bytes = "x\n") -> None:
        full = os.path.join(os.fsencode(self.path), os.fsencode(rel))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)

    def remove(self, rel: str) -> None:
        (self.path / rel).unlink()

    def commit(self, message: str, allow_empty: bool = False) -> str:
        """Stage everything and commit one minute after the previous commit; returns the sha."""
        self.minute += 1
        self.git("add", "-A")
        extra = ["--allow-empty"] if allow_empty else []
        self.git("commit", "-q", "--allow-empty-message", *extra, "-m", message)
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def make_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], GitRepo]:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")

    def make(name: str = "repo") -> GitRepo:
        path = tmp_path / name
        path.mkdir()
        return GitRepo(path)

    return make


@pytest.fixture
def load_env_module() -> Callable[[], ModuleType]:
    """Loads a fresh copy of recipes/file_selection/env.py (its own ToolServer, no shared state)."""
    return lambda: load_fresh(RECIPE / "env.py")


@pytest.fixture
def recipe() -> Path:
    """The recipe's folder: env.py, job.yaml, grader.json."""
    return RECIPE
