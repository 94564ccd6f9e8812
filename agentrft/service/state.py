"""What every route of the service shares: the store, the data directory, the executor and
the API keys and the secret store; plus the caller's identity, the request's JSON body, its required parameters
and OpenAI-style list pages."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from agentrft.serve.protocol import RequestError
from agentrft.service.executor import LocalExecutor
from agentrft.service.secret_store import SecretStore
from agentrft.service.store import Store

OPEN_OWNER = "local"  # the one owner when the server runs without API keys
MAX_PAGE = 100


@dataclass
class ServiceState:
    data_dir: Path
    store: Store
    executor: LocalExecutor
    api_keys: frozenset[str]
    secrets: SecretStore
    chat: Any = None  # agentrft.service.models.ChatModels, made on first use

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"


def state_of(request: Request) -> ServiceState:
    return request.app.state.service  # type: ignore[no-any-return]


def owner_of_key(key: str) -> str:
    """Objects are owned by a hash of the key, so the database never holds a key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def caller(request: Request) -> str:
    """The owner behind the request's `Authorization: Bearer KEY`; 401 without a valid key.
    A server started without keys is open: every caller is the same owner."""
    keys = state_of(request).api_keys
    if not keys:
        return OPEN_OWNER
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if not key:
        key = request.cookies.get("agentrft_key", "")  # the dashboard's login
        scheme = "bearer" if key else scheme
    if scheme.lower() != "bearer" or not key:
        raise RequestError(
            "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
            None,
            "missing_api_key",
            401,
        )
    if not any(hmac.compare_digest(key, k) for k in keys):
        raise RequestError("Incorrect API key provided.", None, "invalid_api_key", 401)
    return owner_of_key(key)


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(
            f"the request body is not valid JSON: {exc}", None, "invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None, "invalid_json")
    return body


def required(
    body: dict[str, Any], key: str, kind: type, param: str | None = None, hint: str = ""
) -> Any:
    """`body[key]` when it is a `kind`, else OpenAI's 400 for a missing parameter, naming it
    `param` (its path in the request; default `key`) and saying what it should be (`hint`)."""
    value = body.get(key)
    if not isinstance(value, kind):
        param = param or key
        if value is not None:  # there, but of the wrong type: OpenAI's invalid_type
            raise RequestError(
                f"Invalid type for '{param}': expected {_JSON_TYPES.get(kind, kind.__name__)}, "
                f"but got {_JSON_TYPES.get(type(value), type(value).__name__)} instead."
                + (f" ({hint})" if hint else ""),
                param,
                "invalid_type",
            )
        raise RequestError(
            f"Missing required parameter: '{param}'" + (f" ({hint})" if hint else ""),
            param,
            "missing_required_parameter",
        )
    return value


_JSON_TYPES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a decimal",
    bool: "a boolean",
}


def page_limit(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise RequestError(
            f"limit must be an integer, got {raw!r}", "limit", "invalid_value"
        ) from None
    if not 1 <= limit <= MAX_PAGE:
        raise RequestError(
            f"limit must be between 1 and {MAX_PAGE}, got {limit}", "limit", "invalid_value"
        )
    return limit


def list_page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page from `limit + 1` rows: the extra one only says there is more."""
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "has_more": len(items) > limit,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def read_keys(path: str | Path | None, env_value: str | None) -> frozenset[str]:
    """API keys from a file (one per line, `#` comments) and from a comma- or
    whitespace-separated environment variable."""
    keys: set[str] = set()
    if path:
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.add(line)
    if env_value:
        keys |= {k for k in env_value.replace(",", " ").split() if k}
    return frozenset(keys)
