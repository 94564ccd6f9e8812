"""`endpoint` (Agent RFT): the user's own HTTP reward service grades the whole rollout.

    {"type": "endpoint", "name": "env", "url": "https://my-env.example.com/grade",
     "headers": {"Authorization": "Bearer ..."}, "rate_limit": 20, "timeout_s": 60,
     "range": [0, 1]}

Request:  POST url  {"sample": {...}, "item": {...}, "trace_id": "trace_..."}
Response: {"score": <float>}   (optionally "sub_scores": {name: float} and "metrics": {...})

The score must lie in `range` (default [0, 1], as for OpenAI's graders; widen it for
penalties such as -1) and every sub-score must be a finite number. A reply that breaks
either is a bug in the grader, not a verdict on the rollout: it flags
`endpoint_grader_score_error` and the sample is excluded, never clipped or scored.

A JSON object whose `score` is missing, not a number (a string, a bool, null) or not finite
(NaN, Infinity) can never become valid either: it is flagged the same way on the first
reply, never retried.

`trace_id` is the rollout's, so a server that kept per-rollout state for its tools (see
agentrft.tools.envkit) can inspect it. Retries follow the tool rule, through the same code
(`post_with_retries`): 5xx, timeouts, connection errors and replies that are not a JSON
object (a proxy's error page, a cut-off body) are retried `retries` times (default 3) with
backoff, then the sample is discarded with `unresponsive_reward_error`. A 4xx, or a request over 1 MiB, flags
`endpoint_grader_client_error`. `rate_limit` caps requests per second from this process.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from agentrft.errors import GraderUnavailable
from agentrft.graders.protocol import AsyncGrader, checked_score, failed, pooled_client
from agentrft.graders.spec import BuildContext, Strict
from agentrft.redact import redact_url
from agentrft.types import Grade


class EndpointSpec(Strict):
    type: Literal["endpoint"]
    name: str = "endpoint"
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    rate_limit: float | None = Field(default=None, gt=0)  # requests per second
    timeout_s: float = Field(default=60.0, gt=0)
    retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    range: list[float] = Field(
        default_factory=lambda: [0.0, 1.0], min_length=2, max_length=2
    )  # accepted scores

    @model_validator(mode="after")
    def _range_ordered(self) -> EndpointSpec:
        if not (
            math.isfinite(self.range[0])
            and math.isfinite(self.range[1])
            and self.range[0] < self.range[1]
        ):
            raise ValueError(f"range must be [low, high] with finite low < high, got {self.range}")
        return self


def _reply(data: bytes) -> dict[str, Any]:
    """The parsed reply; ValueError (retried, then discarded) when it is not a JSON object,
    which a transient fault (a proxy's page, a cut-off body) explains."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f'expected {{"score": <float>}}, got JSON {type(obj).__name__}')
    return obj


class EndpointGrader(AsyncGrader):
    """Picklable: the HTTP client comes from the event loop (see protocol.http_client)."""

    type = "endpoint"

    def __init__(self, spec: EndpointSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self._next_slot = 0.0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])  # type: ignore[misc]

    async def _wait_for_slot(self) -> None:
        """Space requests 1/rate_limit seconds apart, across all coroutines and threads."""
        if self.spec.rate_limit is None:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next_slot)
            self._next_slot = slot + 1.0 / self.spec.rate_limit
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str
    ) -> Grade:
        from agentrft.tools.http import MAX_PAYLOAD_BYTES, PayloadTooLarge, post_with_retries

        body = json.dumps(
            {"sample": sample, "item": item, "trace_id": trace_id}, ensure_ascii=False, default=str
        ).encode()
        if len(body) > MAX_PAYLOAD_BYTES:
            return failed(
                "endpoint_grader_client_error",
                f"the grading request is {len(body)} bytes, over the 1 MiB limit (413); not sent",
            )
        await self._wait_for_slot()
        try:
            async with pooled_client() as client:
                reply = await post_with_retries(
                    client,
                    self.spec.url,
                    body,
                    headers=self.spec.headers,
                    timeout=self.spec.timeout_s,
                    retries=self.spec.retries,
                    backoff_s=self.spec.backoff_s,
                    error_cls=GraderUnavailable,
                    validate=_reply,
                )
        except GraderUnavailable as exc:
            return failed("unresponsive_reward_error", str(exc))
        except PayloadTooLarge:
            return failed(
                "endpoint_grader_client_error",
                f"{redact_url(self.spec.url)}: the reply is over 1 MiB (413)",
            )
        if reply.status >= 400:
            return failed(
                "endpoint_grader_client_error",
                f"{redact_url(self.spec.url)}: HTTP {reply.status}: {reply.body[:300].decode('utf-8', 'replace')}",
            )
        obj = _reply(reply.body)
        where = redact_url(self.spec.url)
        if "score" not in obj:  # the grader's own bug: retrying gives the same reply
            keys = ", ".join(sorted(map(str, obj))[:10]) or "none"
            return failed(
                "endpoint_grader_score_error",
                f'{where}: the reply has no "score" (keys: {keys}); expected {{"score": <float>}}',
            )
        try:
            score = checked_score(obj["score"])
        except ValueError as exc:
            return failed("endpoint_grader_score_error", f"{where}: {exc}")
        lo, hi = self.spec.range
        if not lo <= score <= hi:
            return failed(
                "endpoint_grader_score_error",
                f"{where}: score {score:g} is outside the grader's range [{lo:g}, {hi:g}]; "
                "fix the grader, or set `range` if such scores are meant",
            )
        raw_subs = obj.get("sub_scores", {})
        if not isinstance(raw_subs, dict):
            return failed(
                "endpoint_grader_score_error",
                f"{where}: sub_scores must be an object of numbers, got {type(raw_subs).__name__}",
            )
        subs: dict[str, float] = {}
        for name, value in raw_subs.items():
            try:
                subs[str(name)] = checked_score(value)
            except ValueError as exc:
                return failed(
                    "endpoint_grader_score_error", f"{where}: sub_score {str(name)[:80]!r}: {exc}"
                )
        metrics: dict[str, Any] = obj["metrics"] if isinstance(obj.get("metrics"), dict) else {}
        return Grade(
            score, subs, {**metrics, "attempts": reply.attempts, "latency_s": reply.latency_s}
        )


def build(spec: EndpointSpec, path: str, ctx: BuildContext) -> EndpointGrader:
    return EndpointGrader(spec)
