"""Config files as typed data: the strict pydantic base that jobs and graders share, the fix
each validation error suggests, and the one YAML/JSON loader.

Every model built on `Strict` forbids unknown keys and is frozen, so a typo fails at load
time with the field and the fix instead of silently changing a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from agentrft.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def fix_for(err: Mapping[str, Any], unknown_top_level: str | None = None) -> str:
    """What to change for one pydantic error. `unknown_top_level`: the advice for an unknown
    key at the top of the file (a job says where agentrft's own settings go)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        if unknown_top_level is not None and len(err["loc"]) == 1:
            return unknown_top_level
        return "remove it or check its spelling"
    if kind == "missing":
        return "add this field"
    if kind.startswith("literal_error") or kind == "enum":
        return "use one of the values listed"
    return "correct the value"


def not_utf8(where: str | Path, data: bytes, exc: UnicodeDecodeError) -> str:
    """The message for bytes that are not UTF-8: where (the line in `data`) and the fix."""
    line = data[: exc.start].count(b"\n") + 1
    return (
        f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}) -> save the file as UTF-8"
    )


def read_text_file(path: str | Path, what: str) -> str:
    """The text of a UTF-8 file (a byte-order mark is dropped). Raises ConfigError naming
    the file, and the line, when it is missing, a directory or not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory -> give the {what} file")
    if not path.is_file():
        raise ConfigError(f"{path}: {what} file not found")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8(path, data, exc)) from None


def load_mapping_file(path: str | Path, what: str) -> Any:
    """The parsed content of a JSON file (`.json`) or a YAML file (anything else). Raises
    ConfigError naming the file when it is missing, not UTF-8 or does not parse."""
    path = Path(path)
    text = read_text_file(path, what)
    is_json = path.suffix == ".json"
    try:
        return json.loads(text) if is_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if is_json else 'YAML'}: {exc}") from None
