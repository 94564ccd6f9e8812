"""The service's state: files, jobs and job events in one SQLite database under the data
directory (`service.db`). Artifacts (uploaded files, run directories) live next to it as
plain files; this module only records where.

Only the server process writes here (workers report through files in their run
directory), so one connection guarded by a lock is enough. Every row carries its `owner`
(a hash of the API key that created it) and every read filters on it: a foreign id reads
exactly like a missing one.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, status TEXT NOT NULL, rows INTEGER,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, created_at INTEGER NOT NULL, status TEXT NOT NULL,
    request TEXT NOT NULL, fine_tuned_model TEXT, finished_at INTEGER, error TEXT,
    model_deleted INTEGER NOT NULL DEFAULT 0, metrics_seen INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL, job_id TEXT NOT NULL, created_at INTEGER NOT NULL,
    level TEXT NOT NULL, message TEXT NOT NULL, type TEXT NOT NULL, data TEXT
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
"""

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def _row(cur: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cur.description, values, strict=True)}


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = _row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a restart after kill -9 loses no job
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> dict[str, Any] | None:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- files ---------------------------------------------------------------------------
    def add_file(
        self, file_id: str, owner: str, filename: str, purpose: str, size: int, rows: int | None
    ) -> dict[str, Any]:
        with self._tx() as db:
            db.execute(
                "INSERT INTO files (id, owner, filename, purpose, bytes, created_at, status, rows) VALUES (?,?,?,?,?,?,?,?)",
                (file_id, owner, filename, purpose, size, int(time.time()), "processed", rows),
            )
        found = self.file(file_id, owner)
        assert found is not None
        return found

    def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        return self._one(
            "SELECT * FROM files WHERE id=? AND owner=? AND deleted=0", (file_id, owner)
        )

    def files(
        self, owner: str, purpose: str | None, after: str | None, limit: int, order: str = "desc"
    ) -> list[dict[str, Any]]:
        direction, cmp = ("DESC", "<") if order == "desc" else ("ASC", ">")
        sql = "SELECT * FROM files WHERE owner=? AND deleted=0"
        args: list[Any] = [owner]
        if purpose:
            sql += " AND purpose=?"
            args.append(purpose)
        if after:
            sql += f" AND seq {cmp} COALESCE((SELECT seq FROM files WHERE id=? AND owner=?), seq)"
            args += [after, owner]
        return self._all(sql + f" ORDER BY seq {direction} LIMIT ?", (*args, limit))

    def delete_file(self, file_id: str, owner: str) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE files SET deleted=1 WHERE id=? AND owner=? AND deleted=0",
                    (file_id, owner),
                ).rowcount
                > 0
            )

    # -- jobs ----------------------------------------------------------------------------
    def add_job(
        self,
        job_id: str,
        owner: str,
        request: dict[str, Any],
        fine_tuned_model: str,
        messages: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Insert a new job and its first events (`messages`) in one transaction, and return
        its row as inserted: the scheduler may move it on right after."""
        now = int(time.time())
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, owner, created_at, status, request, fine_tuned_model) VALUES (?,?,?,?,?,?)",
                (job_id, owner, now, "validating_files", json.dumps(request), fine_tuned_model),
            )
            for message in messages:
                db.execute(
                    "INSERT INTO events (id, job_id, created_at, level, message, type) VALUES (?,?,?,?,?,?)",
                    (new_id("ftevent"), job_id, now, "info", message, "message"),
                )
            found: dict[str, Any] = db.execute(
                "SELECT * FROM jobs WHERE id=?", (job_id,)
            ).fetchone()
        return found

    def job(self, job_id: str, owner: str | None = None) -> dict[str, Any] | None:
        if owner is None:
            return self._one("SELECT * FROM jobs WHERE id=?", (job_id,))
        return self._one("SELECT * FROM jobs WHERE id=? AND owner=?", (job_id, owner))

    def jobs(
        self,
        owner: str | None,
        after: str | None = None,
        limit: int = 20,
        metadata: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `after` is the id of the last job of the previous page; `metadata`
        keeps the jobs whose metadata has every one of these values."""
        sql = "SELECT * FROM jobs WHERE 1=1"
        args: list[Any] = []
        for key, value in (metadata or {}).items():
            sql += " AND json_extract(request, ?) = ?"
            args += ["$.metadata." + json.dumps(key), value]
        if owner is not None:
            sql += " AND owner=?"
            args.append(owner)
        if after:
            sql += " AND seq < COALESCE((SELECT seq FROM jobs WHERE id=?), seq + 1)"
            args.append(after)
        return self._all(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))

    def jobs_with_status(self, *statuses: str) -> list[dict[str, Any]]:
        marks = ",".join("?" * len(statuses))
        return self._all(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses)

    def set_status(
        self,
        job_id: str,
        status: str,
        *,
        only_from: tuple[str, ...] | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Move a job to `status` (when it is in one of `only_from`); a terminal status
        stamps `finished_at`. Returns whether the job moved."""
        finished = int(time.time()) if status in TERMINAL else None
        sql = "UPDATE jobs SET status=?, finished_at=?, error=? WHERE id=?"
        args: list[Any] = [status, finished, json.dumps(error) if error else None, job_id]
        if only_from:
            sql += f" AND status IN ({','.join('?' * len(only_from))})"
            args += list(only_from)
        with self._tx() as db:
            return db.execute(sql, args).rowcount > 0

    def set_metrics_seen(self, job_id: str, n: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET metrics_seen=? WHERE id=?", (n, job_id))

    def delete_model(self, model: str, owner: str) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET model_deleted=1 WHERE fine_tuned_model=? AND owner=? AND status='succeeded' AND model_deleted=0",
                (model, owner),
            )
            return cur.rowcount > 0

    def job_of_model(self, model: str, owner: str) -> dict[str, Any] | None:
        return self._one(
            "SELECT * FROM jobs WHERE fine_tuned_model=? AND owner=? AND status='succeeded' AND model_deleted=0",
            (model, owner),
        )

    def job_named(self, model: str, owner: str) -> dict[str, Any] | None:
        """The job whose fine-tuned model is `model`, whatever its status."""
        return self._one(
            "SELECT * FROM jobs WHERE fine_tuned_model=? AND owner=? AND model_deleted=0",
            (model, owner),
        )

    def models(self, owner: str) -> list[dict[str, Any]]:
        return self._all(
            "SELECT * FROM jobs WHERE owner=? AND status='succeeded' AND model_deleted=0 ORDER BY seq",
            (owner,),
        )

    # -- events --------------------------------------------------------------------------
    def add_event(
        self,
        job_id: str,
        message: str,
        *,
        level: str = "info",
        kind: str = "message",
        data: dict[str, Any] | None = None,
        event_id: str | None = None,
    ) -> None:
        """Append one event; an `event_id` already present is skipped (a step redone after
        a resume logs the same metrics event once)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO events (id, job_id, created_at, level, message, type, data) VALUES (?,?,?,?,?,?,?)",
                (
                    event_id or new_id("ftevent"),
                    job_id,
                    int(time.time()),
                    level,
                    message,
                    kind,
                    json.dumps(data) if data is not None else None,
                ),
            )

    def events(self, job_id: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Newest first, as OpenAI lists them; `after` is the last event id already seen."""
        sql = "SELECT * FROM events WHERE job_id=?"
        args: list[Any] = [job_id]
        if after:
            sql += " AND seq < COALESCE((SELECT seq FROM events WHERE id=? AND job_id=?), seq + 1)"
            args += [after, job_id]
        return self._all(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))
