"""Git for test repositories: a fixed identity and fixed dates, and no host configuration,
so a test builds the same commits on any machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

T0 = 1_700_000_000  # the commit time unless a test gives its own


def git(path: Path, *args: str | bytes, when: int = T0) -> str:
    """Run `git -C path ARGS` committing as "t" at `when` (Unix seconds); its stdout."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": f"@{when} +0000",
        "GIT_COMMITTER_DATE": f"@{when} +0000",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    out = subprocess.run(["git", "-C", str(path), *args], env=env, capture_output=True, check=True)
    return out.stdout.decode().strip()
