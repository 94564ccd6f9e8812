"""What serve-model lets in: a per-server cap on queued tokens, and each request's events.

A request reserves `n x max_tokens` tokens for as long as it is queued or decoding. Past
`max_queued_tokens` in all it gets 429 with `Retry-After` (the seconds the server needs to
sample the excess at its measured rate), so nobody can queue unbounded work by sending
large requests. A request larger than the whole cap gets 400: it could never run.

`Reply` is a request's event stream that gives its reservation back however it ends: read
to the end, closed early (the client went away, the server shut down), or dropped unread.
All of this runs on the server's event loop, so the counts need no lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

from agentrft.policy import Completion
from agentrft.serve.protocol import RequestError

MAX_QUEUED_TOKENS = 262_144  # n x max_tokens over all queued and running requests
RETRY_AFTER_MAX_S = 60


class TokenBudget:
    """The queued-token cap of one server, and its measured sampling rate."""

    def __init__(self, limit: int = MAX_QUEUED_TOKENS) -> None:
        if limit < 1:
            raise ValueError("max_queued_tokens must be at least 1")
        self.limit = limit
        self.used = 0
        self.refused = 0
        self._sampled = 0  # tokens sampled while busy, and the busy seconds: the rate
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._open = 0

    def reserve(self, tokens: int) -> Reservation:
        """Reserve `tokens`, or raise RequestError: 400 past the whole cap, 429 past what
        is free now (with Retry-After)."""
        if tokens > self.limit:
            raise RequestError(
                f"n x max_tokens = {tokens} is over this server's limit of {self.limit} queued "
                "tokens; lower n or max_tokens",
                "max_tokens",
                "too_many_tokens",
            )
        if self.used + tokens > self.limit:
            self.refused += 1
            wait = math.ceil((self.used + tokens - self.limit) / self.rate())
            wait = min(max(wait, 1), RETRY_AFTER_MAX_S)
            raise RequestError(
                f"this server has {self.used} tokens queued (limit {self.limit}); retry in {wait} s",
                None,
                "rate_limit_exceeded",
                429,
                {"Retry-After": str(wait)},
            )
        self.used += tokens
        if self._open == 0:
            self._busy_since = time.monotonic()
        self._open += 1
        return Reservation(self, tokens)

    def rate(self) -> float:
        """Tokens sampled per busy second so far (20 until anything was measured)."""
        busy = self._busy_s + (
            time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        )
        return self._sampled / busy if self._sampled and busy > 0 else 20.0

    def _release(self, tokens: int, sampled: int) -> None:
        self.used -= tokens
        self._sampled += sampled
        self._open -= 1
        if self._open == 0 and self._busy_since is not None:
            self._busy_s += time.monotonic() - self._busy_since
            self._busy_since = None


class Reservation:
    def __init__(self, budget: TokenBudget, tokens: int) -> None:
        self.budget, self.tokens = budget, tokens
        self.sampled = 0
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget._release(self.tokens, self.sampled)


class Reply:
    """A request's events (`(choice, token id | Completion)`), holding its reservation until
    the events end or it is closed."""

    def __init__(self, events: AsyncIterator[tuple[int, int | Completion]], held: Reservation):
        self._events, self._held = events, held

    def __aiter__(self) -> Reply:
        return self

    async def __anext__(self) -> tuple[int, int | Completion]:
        try:
            event = await self._events.__anext__()
        except BaseException:
            await self.aclose()
            raise
        if isinstance(event[1], Completion):
            self._held.sampled += len(event[1].tokens)
        return event

    async def aclose(self) -> None:
        self._held.release()
        close: Any = getattr(self._events, "aclose", None)
        if close is not None:
            await close()

    def __del__(self) -> None:
        self._held.release()
