"""Secrets stay out of run directories, logs and metrics.

A job carries secrets in three places: header values (tools, endpoint graders, the judge),
URL credentials (`https://user:pass@host/...`, `?api_key=...` and any other query value) and
the environment server's variables. `redact_job` replaces them before a job is written to a
run directory (a resume takes them from the job file again, see `restore_secrets`), and
`redact_urls` cleans every URL in a message before it becomes a discard reason, which
rollouts.jsonl, the console and metric keys all repeat.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "REDACTED"
_URL = re.compile(
    r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,;:)\]]"
)  # not its closing punctuation


def redact_url(url: str) -> str:
    """`url` without its user:password and with every query value replaced (names kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        query = urlencode(
            [(k, REDACTED) for k, _ in parse_qsl(query, keep_blank_values=True)], safe=""
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_urls(text: str) -> str:
    """Every URL in `text` redacted (see redact_url)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redact_job(data: Any) -> Any:
    """A copy of job (or grader) JSON with header values, the environment server's variables
    and URL credentials replaced by REDACTED. Everything else is kept."""
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("headers", "env") and isinstance(
                value, Mapping
            ):  # env: the environment server's variables
                out[key] = {k: REDACTED for k in value}
            elif isinstance(key, str) and key.endswith("url") and isinstance(value, str):
                out[key] = redact_url(value)
            else:
                out[key] = redact_job(value)
        return out
    if isinstance(data, list):
        return [redact_job(v) for v in data]
    return data


def restore_secrets(stored: Any, source: Any, where: str) -> Any:
    """The job to resume: `source` (the job file, with its secrets) when it matches the
    redacted `stored` copy, else `stored` itself when it held no secrets. ValueError (with
    the fix) when secrets were redacted and the job file no longer matches."""
    if not _has_redactions(stored):
        return stored
    if source is not None and redact_job(source) == stored:
        return source
    raise ValueError(
        f"{where}: the saved job had its secrets (header values, URL credentials, environment variables) "
        "removed, and the original job file is gone or has changed; resume with the job file: "
        "agentrft train JOB --resume RUN_DIR"
    )


def _has_redactions(data: Any) -> bool:
    if isinstance(data, Mapping):
        return any(_has_redactions(v) for v in data.values())
    if isinstance(data, list):
        return any(_has_redactions(v) for v in data)
    return isinstance(data, str) and REDACTED in data
