"""The grader plug point: rollout -> **grade** -> advantages. What every grader promises.

A grader turns one sample (what the model did, see `sample.py`) and its dataset item into a
`Grade`. Failures are data: a grader that cannot score a sample returns a Grade whose
`error` names why (one of ERROR_FLAGS) and whose `score` is NaN, so a caller that forgets to
check `error` gets a loud NaN rather than a silent 0. Such samples stay out of training
statistics. Only setup problems (no sandbox, no model) raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from agentrft.errors import AgentRFTError
from agentrft.graders.template import MissingItemField
from agentrft.types import Grade

# Error flags: OpenAI's grader-run names where one exists, plus agentrft's own.
ERROR_FLAGS = {
    "formula_parse_error": "the multi grader's formula could not be evaluated",
    "formula_runtime_error": "the formula hit a math error (division by zero, log of 0, overflow, ...)",
    "invalid_variable_error": "a template names an item field the dataset row does not have",
    "model_grader_parse_error": "the judge's reply held no usable score or label",
    "model_grader_refusal_error": "the judge refused to grade",
    "model_grader_server_error": "the judge endpoint kept failing after retries",
    "python_grader_runtime_error": "the python grader raised, returned a non-number, or ran out of memory",
    "python_grader_timeout": "the python grader ran past its CPU or wall-clock limit",
    "unresponsive_reward_error": "the endpoint grader kept failing after retries",
    "endpoint_grader_client_error": "the endpoint grader answered 4xx, or the request was over 1 MiB",
    "endpoint_grader_score_error": "the endpoint grader's score was outside its `range`, or a sub-score was not a finite number",
    "other_error": "an unexpected failure inside a grader (details in metrics.error_details)",
}

NAN = float("nan")


@runtime_checkable
class Grader(Protocol):
    """`grade` is for synchronous callers outside an event loop; `agrade` gives the same
    result and is what the training loop awaits, many at once. Both never raise for a bad
    sample (see the module docstring). Graders are picklable."""

    name: str
    type: str

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade: ...

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade: ...


SpecT = TypeVar("SpecT")


class LocalGrader(Generic[SpecT]):
    """A grader computed in this process by `_grade(sample, item)`, which may raise: a
    missing item field becomes `invalid_variable_error` and an unexpected exception
    `other_error` (grade_safely). `agrade` runs it inline."""

    type: str

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec
        self.name: str = spec.name  # type: ignore[attr-defined]  # every grader spec has a name

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return grade_safely(lambda: self._grade(sample, item))

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return self.grade(sample, item, trace_id)

    def _grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Grade:
        raise NotImplementedError


class AsyncGrader:
    """A grader whose work is a coroutine, `_agrade(sample, item, trace_id)` (an HTTP call, a
    sandboxed process), which may raise: an unexpected exception becomes `other_error`
    (agrade_safely). `grade` runs it to completion for synchronous callers (run_sync)."""

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return run_sync(self.agrade(sample, item, trace_id))

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return await agrade_safely(lambda: self._agrade(sample, item, trace_id))

    async def _agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str
    ) -> Grade:
        raise NotImplementedError


def failed(flag: str, details: str = "", **metrics: Any) -> Grade:
    """A Grade that says why the sample could not be scored."""
    assert flag in ERROR_FLAGS, flag
    return Grade(NAN, {}, {**metrics, "error_details": details}, flag)


def checked_score(value: Any) -> float:
    """A finite float, or ValueError naming what came back instead."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"a score must be a number, got {type(value).__name__}: {str(value)[:80]!r}"
        )
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"a score must be finite, got {score}")
    return score


def grade_safely(fn: Callable[[], Grade]) -> Grade:
    """Run a synchronous scoring function. A template naming an item field the row lacks
    becomes `invalid_variable_error`, an unexpected exception `other_error`. agentrft's own
    setup errors (sandbox missing, model missing) still raise."""
    t0 = time.perf_counter()
    try:
        grade = fn()
    except AgentRFTError:
        raise
    except MissingItemField as exc:
        return failed("invalid_variable_error", str(exc))
    except Exception as exc:  # a bug or bad input inside a metric: data, never a crash
        return failed("other_error", f"{type(exc).__name__}: {exc}")
    return _timed(grade, t0)


async def agrade_safely(fn: Callable[[], Awaitable[Grade]]) -> Grade:
    t0 = time.perf_counter()
    try:
        grade = await fn()
    except AgentRFTError:
        raise
    except Exception as exc:
        return failed("other_error", f"{type(exc).__name__}: {exc}")
    return _timed(grade, t0)


def _timed(grade: Grade, t0: float) -> Grade:
    if "execution_time" in grade.metrics:
        return grade
    return Grade(
        grade.score,
        grade.sub_scores,
        {**grade.metrics, "execution_time": time.perf_counter() - t0},
        grade.error,
    )


def run_sync(coro: Awaitable[Grade]) -> Grade:
    """`grade()` for graders whose real work is async. Not for use inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    coro.close()  # type: ignore[attr-defined]
    raise RuntimeError("grade() was called inside a running event loop; await agrade() instead")


# The pooled HTTP client of the current event loop, set by grade_groups; endpoint graders and
# endpoint judges use it when present, else open a short-lived one of their own.
http_client: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "agentrft_grader_http_client", default=None
)


@contextlib.asynccontextmanager
async def pooled_client() -> AsyncIterator[Any]:
    """This event loop's pooled `http_client`, or a short-lived client of its own where none
    is set (a grader called outside grade_groups), closed on exit."""
    client = http_client.get()
    if client is not None:
        yield client
        return
    from agentrft.tools.http import new_client

    async with new_client(4) as own:
        yield own


def run_response(grader: Grader, grade: Grade) -> dict[str, Any]:
    """The shape of OpenAI's grader-run response, from one Grade."""
    errors: dict[str, Any] = {flag: grade.error == flag for flag in ERROR_FLAGS}
    metrics = {k: v for k, v in grade.metrics.items() if k != "execution_time"}
    return {
        "reward": None if grade.error else grade.score,
        "sub_rewards": dict(grade.sub_scores),
        "metadata": {
            "name": grader.name,
            "type": grader.type,
            "errors": errors,
            "error": grade.error,
            "execution_time": grade.metrics.get("execution_time"),
            "scores": dict(grade.sub_scores),
            "metrics": metrics,
        },
    }
