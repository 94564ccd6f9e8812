"""`serve-model --request-log FILE`: an opt-in JSONL log of the chat requests served, so that
`agentrft doctor JOB --traffic FILE` can compare training rows with real traffic.

One line per request, secrets redacted (agentrft.redact.redact_text on every message text and
tool argument; request headers are never logged):

    {"time": 1733230000.0, "model": "...", "messages": [{"role", "content", "tool_calls"?}, ...],
     "tools": ["lookup"], "stream": false,
     "response": {"content": "...", "tool_calls": 1, "finish_reason": "tool_calls"} | null}

`response` is null for a streamed request (its reply is not assembled here) and for one that
failed. The file is created 0600 and appended to; lines from concurrent requests never mix.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrft.redact import redact_text


def _clean(value: Any) -> Any:
    """A JSON-safe copy of `value` with every string redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def logged_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a chat message the traffic check reads, redacted."""
    keep = {k: message[k] for k in ("role", "content", "tool_calls", "name") if k in message}
    return _clean(keep)  # type: ignore[no-any-return]


def response_summary(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The first choice of a `chat.completion` body: its text, tool-call count and finish."""
    choices = (body or {}).get("choices") or []
    if not choices:
        return None
    msg = choices[0].get("message") or {}
    return {
        "content": redact_text(str(msg.get("content") or "")),
        "tool_calls": len(msg.get("tool_calls") or []),
        "finish_reason": choices[0].get("finish_reason"),
    }


class RequestLog:
    """Appends one redacted line per served request to `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        stream: bool,
        response: Mapping[str, Any] | None,
    ) -> None:
        line = {
            "time": time.time(),
            "model": model,
            "messages": [logged_message(m) for m in messages],
            "tools": [str((t.get("function") or {}).get("name", "")) for t in tools or []],
            "stream": stream,
            "response": response_summary(response),
        }
        text = json.dumps(line, ensure_ascii=False) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
