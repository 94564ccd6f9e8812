"""Load a dataset: one JSON object per line, `{"messages": [...], ...}`; and the one JSONL
writer (datasets, rollouts, metrics) that every part of agentrft writes with.

The last message is the user's. Every other key is the row's *item*, which graders reach as
`{{item.field}}` and which is sent with every tool call. agentrft reserves one optional
row key, `prefill` (a string), which overrides the job's reply prefill for that row.

Every bad line is reported with its file, line number and the fix; nothing is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrft.errors import ConfigError
from agentrft.types import Item

ROLES = {"system", "developer", "user", "assistant", "tool"}


def write_jsonl(path: str | Path, rows: Iterable[Any], append: bool = False) -> int:
    """Write (or append) one JSON object per line; returns how many. UTF-8 stays readable;
    U+2028/U+2029 are escaped, as many readers split lines there; NaN is refused (it is not
    JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for row in rows:
            line = json.dumps(row, ensure_ascii=False, allow_nan=False)
            fh.write(line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n")
            n += 1
    return n


MAX_REPORTED = 20


def content_text(content: Any) -> str | None:
    """OpenAI allows a string or a list of content parts; agentrft handles text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("text", "input_text") for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def parse_row(obj: Any, where: str, index: int) -> Item:
    """Validate one decoded row; raise ConfigError naming `where` and the fix."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: a row must be a JSON object, got {type(obj).__name__}")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        problem = (
            'missing "messages"'
            if messages is None
            else '"messages" is an empty list'
            if isinstance(messages, list)
            else f'"messages" must be a list of messages, got {type(messages).__name__} {json.dumps(messages)[:40]}'
        )
        raise ConfigError(
            f'{where}: {problem} -> give a non-empty list like [{{"role": "user", "content": "..."}}]'
        )
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ConfigError(f'{where}: messages[{i}] needs a "role" among {sorted(ROLES)}')
        text = content_text(m.get("content"))
        if text is None:
            raise ConfigError(
                f"{where}: messages[{i}].content must be a string or a list of text parts"
            )
        clean.append({**m, "content": text})
    if clean[-1]["role"] != "user":
        raise ConfigError(
            f'{where}: the last message must have role "user" (it is "{clean[-1]["role"]}") -> end each row with the user\'s request'
        )
    prefill = obj.get("prefill")
    if prefill is not None and not isinstance(prefill, str):
        raise ConfigError(f'{where}: "prefill" must be a string')
    fields = {k: v for k, v in obj.items() if k not in ("messages", "prefill")}
    return Item(index=index, messages=tuple(clean), fields=fields, source=where, prefill=prefill)


def load_dataset(path: str | Path, limit: int | None = None) -> list[Item]:
    """All rows of a JSONL file, validated up front. Blank lines are allowed and ignored."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: dataset file not found")
    items: list[Item] = []
    problems: list[str] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = ""
                problems.append(
                    f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x}) -> save the file as UTF-8"
                )
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(
                    f"{where}: not valid JSON ({exc.msg} at column {exc.colno}) -> one JSON object per line"
                )
                continue
            try:
                items.append(parse_row(obj, where, index=len(items)))
            except ConfigError as exc:
                problems.append(str(exc))
            if len(problems) >= MAX_REPORTED:
                problems.append("(stopped after 20 problems)")
                break
    if len(problems) == 1:  # one line that names the file, the line and the fix
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{path}: {len(problems)} bad line(s)\n  " + "\n  ".join(problems))
    if not items:
        raise ConfigError(f"{path}: the dataset is empty -> add at least one row")
    return items[:limit] if limit else items
