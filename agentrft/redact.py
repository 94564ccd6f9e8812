"""Secrets stay out of run directories, logs and metrics.

A job carries secrets in three places: header values (tools, endpoint graders, the judge),
URL credentials (`https://user:pass@host/...`, `?api_key=...` and any other query value) and
the environment server's variables. `redact_job` replaces them before a job is written to a
run directory (a resume takes them from the job file again, see `restore_secrets`), and
`redact_urls` cleans every URL in a message before it becomes a discard reason, which
rollouts.jsonl, the console and metric keys all repeat. `mask_job` is the form an API
response shows: each secret masked the way OpenAI shows its keys (`Bear...et-1`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "REDACTED"
_URL = re.compile(
    r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,;:)\]]"
)  # not its closing punctuation


Hide = Callable[[str], str]  # a secret -> what is shown in its place


def _redacted(_secret: str) -> str:
    return REDACTED


def mask_secret(secret: str) -> str:
    """OpenAI's way of showing a key: its first 4 and last 4 characters around `...`, and
    only `****` when that would show half of it or more."""
    return f"{secret[:4]}...{secret[-4:]}" if len(secret) >= 16 else "****"


def redact_url(url: str, hide: Hide = _redacted) -> str:
    """`url` without its user:password and with every query value replaced (names kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return hide(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{hide(userinfo)}@{host}"
    query = parts.query
    if query:
        query = urlencode(
            [(k, hide(v)) for k, v in parse_qsl(query, keep_blank_values=True)], safe=".*"
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_urls(text: str) -> str:
    """Every URL in `text` redacted (see redact_url)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redact_job(data: Any, hide: Hide = _redacted) -> Any:
    """A copy of job (or grader) JSON with header values, the environment server's variables
    and URL credentials replaced by `hide(value)` (default REDACTED). Everything else is kept."""
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("headers", "env") and _is_flat(value):
                # env: the environment server's variables (not a multi grader's sub-grader "env")
                out[key] = {k: hide(str(v)) for k, v in value.items()}
            elif isinstance(key, str) and key.endswith("url") and isinstance(value, str):
                out[key] = redact_url(value, hide)
            else:
                out[key] = redact_job(value, hide)
        return out
    if isinstance(data, list):
        return [redact_job(v, hide) for v in data]
    return data


def _is_flat(value: Any) -> bool:
    """A mapping of names to plain values, as headers and environment variables are."""
    return isinstance(value, Mapping) and not any(
        isinstance(v, Mapping | list) for v in value.values()
    )


def mask_job(data: Any) -> Any:
    """A copy of job JSON as an API response or the dashboard shows it: every secret masked
    (see mask_secret), everything else kept."""
    return redact_job(data, mask_secret)


def has_secrets(data: Any) -> bool:
    """Whether job JSON holds anything `redact_job` would hide."""
    return bool(redact_job(data) != data)


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


# Secrets as they appear in free text (a chat message, a log line): bearer tokens, keys shaped
# like `sk-...`, and `name=value` / `name: value` pairs whose name says it is a secret.
_TEXT_SECRETS = re.compile(
    r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"
    r"|(\b(?:api[_-]?key|access[_-]?token|token|password|passwd|secret)\b[\"']?\s*[:=]\s*[\"']?)[^\s\"',;]+"
)


def redact_text(text: str) -> str:
    """`text` with its URLs redacted (see redact_url) and bearer tokens, `sk-` keys and
    `api_key=...`-style values replaced by REDACTED."""

    def hide(m: re.Match[str]) -> str:
        prefix = m.group(1) or m.group(3) or ""
        return prefix + REDACTED

    return _TEXT_SECRETS.sub(hide, redact_urls(text))
