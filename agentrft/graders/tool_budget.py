"""`tool_budget` (agentrft): -1 once a rollout makes more than N tool calls, otherwise the
inner grader's score.

    {"type": "tool_budget", "name": "budget", "max_tool_calls": 10, "grader": {...}}

Every call the model attempted counts, malformed ones included (they cost a turn too), from
`sample.tool_calls` (agentrft's whole-trajectory view; a bare OpenAI sample falls back to
`output_tools`). Over budget, the inner grader is not run. `tool_call_limit()` in build.py
finds N anywhere in a grader tree, and `agentrft.runtime.tool_call_cap` makes it the
rollouts' cap, so a rollout stops at call N+1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from agentrft.graders.protocol import Grader
from agentrft.graders.spec import BuildContext, Strict
from agentrft.types import Grade

OVER_BUDGET = -1.0


class ToolBudgetSpec(Strict):
    type: Literal["tool_budget"]
    name: str = "tool_budget"
    max_tool_calls: int = Field(ge=0)
    grader: dict[str, Any]


def count_tool_calls(sample: Mapping[str, Any]) -> int:
    calls = sample.get("tool_calls")
    if calls is None:
        calls = sample.get("output_tools") or []
    return len(calls)


class ToolBudgetGrader:
    type = "tool_budget"

    def __init__(self, spec: ToolBudgetSpec, inner: Grader) -> None:
        self.spec = spec
        self.name = spec.name
        self.max_tool_calls = spec.max_tool_calls
        self.inner = inner

    @property
    def children(self) -> list[Grader]:
        return [self.inner]

    def _over(self, sample: Mapping[str, Any]) -> Grade | None:
        n = count_tool_calls(sample)
        if n > self.max_tool_calls:
            return Grade(OVER_BUDGET, {"tool_calls": float(n)}, {"over_budget": True, "max_tool_calls": self.max_tool_calls})
        return None

    def _within(self, inner: Grade, sample: Mapping[str, Any]) -> Grade:
        sub = {"tool_calls": float(count_tool_calls(sample)), self.inner.name: inner.score}
        sub.update({f"{self.inner.name}.{k}": v for k, v in inner.sub_scores.items()})
        return Grade(inner.score, sub if inner.error is None else {}, {**inner.metrics, "over_budget": False}, inner.error)

    def grade(self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = "") -> Grade:
        return self._over(sample) or self._within(self.inner.grade(sample, item, trace_id), sample)

    async def agrade(self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = "") -> Grade:
        return self._over(sample) or self._within(await self.inner.agrade(sample, item, trace_id), sample)


def build(spec: ToolBudgetSpec, path: str, ctx: BuildContext) -> ToolBudgetGrader:
    return ToolBudgetGrader(spec, ctx.child(spec.grader, f"{path}.grader"))
