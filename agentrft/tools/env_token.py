"""The shared token between agentrft and an environment server it started.

`launch_environment` makes a random token for each server it starts, hands it to the server
as `AGENTRFT_ENV_TOKEN`, and registers it here for the server's origin (scheme, host, port)
while the server runs. Every request agentrft sends to that origin (tool calls and endpoint
grades through `post_with_retries`, and `/cleanup`) carries it in `X-Agentrft-Env-Token`,
and an envkit server that has a token refuses requests without it (401), so another local
user cannot call its tools or end its rollouts' state by guessing a trace id.

The registry is per process and lives only as long as the `launched` block: the servers
agentrft starts are this process's children, and so are the clients that talk to them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

TOKEN_ENV = "AGENTRFT_ENV_TOKEN"
TOKEN_HEADER = "X-Agentrft-Env-Token"
_tokens: dict[str, str] = {}  # origin -> token
_lock = threading.Lock()


def origin(url: str) -> str:
    """scheme://host:port of `url`, lowercased, with the scheme's default port filled in."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    except ValueError:
        port = 0
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


@contextlib.contextmanager
def launched(base_url: str, token: str) -> Iterator[None]:
    """Send `token` on every request to `base_url`'s origin while the block runs."""
    key = origin(base_url)
    with _lock:
        _tokens[key] = token
    try:
        yield
    finally:
        with _lock:
            if _tokens.get(key) == token:
                del _tokens[key]


def with_env_token(url: str, headers: Mapping[str, str]) -> Mapping[str, str]:
    """`headers`, plus the token of the environment server at `url` when agentrft started it
    (a header the caller set already is kept)."""
    with _lock:
        token = _tokens.get(origin(url)) if _tokens else None
    if token is None or any(k.lower() == TOKEN_HEADER.lower() for k in headers):
        return headers
    return {**headers, TOKEN_HEADER: token}
