"""Ranked code search over one revision of a repository (a tool that environments serve).

A small model cannot find files with grep: it searches for whole sentences or invented
names, and grep finds nothing. Code agents search differently: a ranked `search(query)`
over paths, identifiers and content returns the likeliest files for any wording. This is
that search, BM25 (rank-bm25) over one document per file:
- the path's words, counted `PATH_WEIGHT` times (a request often names the module);
- the identifiers and words of the file's text, with `snake_case` and `CamelCase` split
  into their parts as well as kept whole.

Each hit is one numbered line, `1. path  (matches: word, word, ...)`: the number (an answer
may pick files by number), the path, and the query words the file matched, as the reason.

An index is built from a git revision (`CodeIndex.from_git`) without checking it out, or
from a directory (`CodeIndex.from_dir`).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rank_bm25 import BM25Okapi

PATH_WEIGHT = 3
MAX_FILE_BYTES = 1 << 20  # larger files are indexed by their path only
DEFAULT_TOP_K = 5
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Words that say nothing about where a change goes.
STOPWORDS = frozenset(
    (  # noqa: SIM905 (a word list reads best as words)
        "a an and are as at be by for from in into is it its not of on or so than that the this to "
        "was when which with we our you your use used add adds added fix fixes fixed make makes new "
        "now one only also more no do does"
    ).split()
)


def words(text: str) -> list[str]:
    """Lower-case search words of `text`: each identifier whole, plus its snake_case and
    CamelCase parts (`parse_log` -> parse_log, parse, log; `BM25Okapi` -> bm25okapi, bm, 25,
    okapi), without one-letter words and STOPWORDS."""
    out: list[str] = []
    for token in _WORD.findall(text):
        whole = token.lower().strip("_")
        parts = [p.lower() for piece in token.split("_") for p in _PART.findall(piece)]
        for w in [whole, *(p for p in parts if p != whole)]:
            if len(w) > 1 and w not in STOPWORDS:
                out.append(w)
    return out


@dataclass(frozen=True)
class Hit:
    path: str
    score: float
    matched: tuple[str, ...]  # the query words this file contains, best first

    def line(self) -> str:
        reason = ", ".join(self.matched[:4])
        return f"{self.path}  (matches: {reason})" if reason else self.path


def numbered(hits: list[Hit]) -> str:
    """The tool's answer: one numbered line per hit, `1. path  (matches: ...)`, so an answer
    can name a file by its number (see the `file_f1` grader's `resolve_numbers`)."""
    return "\n".join(f"{n}. {h.line()}" for n, h in enumerate(hits, start=1))


class CodeIndex:
    """BM25 over the files of one revision: `search(query, k)` returns the top k files."""

    def __init__(self, files: Mapping[str, str | None]) -> None:
        """`files`: path -> text (None for a binary or oversized file: its path is indexed)."""
        self._build({p: words(files[p] or "") for p in files})

    def _build(self, content_words: Mapping[str, list[str]]) -> None:
        self.paths = sorted(content_words)
        docs = [words(p) * PATH_WEIGHT + content_words[p] for p in self.paths]
        self._terms = [set(d) for d in docs]
        # An empty corpus or an all-empty document list breaks BM25's averages.
        self._bm25 = BM25Okapi([d or ["\0"] for d in docs]) if docs else None

    def __len__(self) -> int:
        return len(self.paths)

    def search(self, query: str, k: int = DEFAULT_TOP_K) -> list[Hit]:
        """The k best files for `query`, best first; files matching no query word are left out."""
        terms = list(dict.fromkeys(words(query)))
        if not terms or self._bm25 is None:
            return []
        scores = self._bm25.get_scores(terms)
        candidates = [i for i in range(len(self.paths)) if not self._terms[i].isdisjoint(terms)]
        candidates.sort(
            key=lambda i: (-scores[i], -len(self._terms[i].intersection(terms)), self.paths[i])
        )
        return [
            Hit(self.paths[i], float(scores[i]), tuple(t for t in terms if t in self._terms[i]))
            for i in candidates[:k]
        ]

    @classmethod
    def from_dir(cls, root: Path, paths: Iterable[str] | None = None) -> CodeIndex:
        """Index the files under `root` (or the given paths relative to it)."""
        if paths is None:
            paths = (
                (Path(d) / n).relative_to(root).as_posix()
                for d, dirs, names in os.walk(root)
                for n in names
                if not dirs.sort()  # walk in a stable order; sort() returns None
            )
        files: dict[str, str | None] = {}
        for rel in paths:
            full = root / rel
            try:
                data = full.read_bytes() if full.stat().st_size <= MAX_FILE_BYTES else b"\0"
            except OSError:
                continue
            files[rel] = _text(data)
        return cls(files)

    @classmethod
    def from_git(cls, repo: str | Path, rev: str) -> CodeIndex:
        """Index revision `rev` of `repo`, read with `git ls-tree` and `git cat-file --batch`
        (no checkout; submodules and symlinks are left out). Neighbouring revisions share
        most files: a file's words are cached by its blob id and read once."""
        index = cls.__new__(cls)
        index._build(_tree_words(repo, rev))
        return index


_BLOB_WORDS: OrderedDict[str, list[str]] = OrderedDict()  # blob id -> words, least recent first
_BLOB_CACHE_SIZE = 100_000
_blob_lock = threading.Lock()


def _text(data: bytes) -> str | None:
    return None if b"\0" in data[:8192] else data.decode("utf-8", errors="replace")


def _tree(repo: str | Path, rev: str) -> list[tuple[str, str, int]]:
    """(path, blob id, size) of every regular file of `rev`."""
    listing = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "-z", "-l", rev], capture_output=True, check=False
    )
    if listing.returncode != 0:
        raise RuntimeError(
            f"git ls-tree {rev} in {repo}: {listing.stderr.decode(errors='replace').strip()}"
        )
    out = []
    for entry in listing.stdout.split(b"\0"):
        if not entry:
            continue
        meta, _, raw_path = entry.partition(b"\t")
        mode, kind, sha, size = meta.split()
        if kind == b"blob" and mode != b"120000":
            out.append((raw_path.decode("utf-8", errors="replace"), sha.decode(), int(size)))
    return out


def _read_blobs(repo: str | Path, shas: list[str]) -> dict[str, bytes]:
    if not shas:
        return {}
    out = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch"],
        input="".join(f"{sha}\n" for sha in shas).encode(),
        capture_output=True,
        check=True,
    ).stdout
    blobs, pos = {}, 0
    for sha in shas:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        blobs[sha] = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return blobs


def read_tree(repo: str | Path, rev: str) -> dict[str, str | None]:
    """path -> text of every regular file of `rev` (None when binary or over MAX_FILE_BYTES)."""
    tree = _tree(repo, rev)
    blobs = _read_blobs(repo, [sha for _, sha, size in tree if size <= MAX_FILE_BYTES])
    return {path: _text(blobs[sha]) if sha in blobs else None for path, sha, _ in tree}


def _tree_words(repo: str | Path, rev: str) -> dict[str, list[str]]:
    """path -> words of the file's text for `rev`, through the blob cache."""
    tree = _tree(repo, rev)
    with _blob_lock:
        missing = sorted(
            {sha for _, sha, size in tree if size <= MAX_FILE_BYTES and sha not in _BLOB_WORDS}
        )
    fresh = {sha: words(_text(data) or "") for sha, data in _read_blobs(repo, missing).items()}
    with _blob_lock:
        _BLOB_WORDS.update(fresh)
        out = {}
        for path, sha, _ in tree:
            if sha in _BLOB_WORDS:
                _BLOB_WORDS.move_to_end(sha)
            out[path] = _BLOB_WORDS.get(sha, [])
        while len(_BLOB_WORDS) > _BLOB_CACHE_SIZE:
            _BLOB_WORDS.popitem(last=False)
    return out
