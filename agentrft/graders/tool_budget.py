"""`tool_budget` (agentrft): a budget on tool calls around an inner grader, set either way.

    {"type": "tool_budget", "name": "budget", "max_tool_calls": 10, "grader": {...}}
        hard cutoff: -1 once a rollout makes more than N calls, otherwise the inner score
    {"type": "tool_budget", "name": "budget", "cost_per_call": 0.05, "free_calls": 2, "grader": {...}}
        soft cost: the inner score minus `cost_per_call` for each call past `free_calls`

Both may be given (the cliff past N, the cost below it); at least one must be.

Every call the model attempted counts, malformed ones included (they cost a turn too), from
`sample.tool_calls` (agentrft's whole-trajectory view; a bare OpenAI sample falls back to
`output_tools`). Over the hard budget, the inner grader is not run. A soft cost is applied to every grade the
inner grader gives (a flagged grade stays flagged), and the sub-score `tool_cost` reports it. `tool_call_limit()` in build.py
finds N anywhere in a grader tree, and `agentrft.runtime.tool_call_cap` makes it the
rollouts' cap, so a rollout stops at call N+1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from agentrft.graders.protocol import Grader
from agentrft.graders.spec import BuildContext, Strict
from agentrft.types import Grade

OVER_BUDGET = -1.0


class ToolBudgetSpec(Strict):
    type: Literal["tool_budget"]
    name: str = "tool_budget"
    max_tool_calls: int | None = Field(default=None, ge=0)
    cost_per_call: float = Field(default=0.0, ge=0)
    free_calls: int = Field(default=0, ge=0)
    grader: dict[str, Any]

    @model_validator(mode="after")
    def _some_budget(self) -> ToolBudgetSpec:
        if self.max_tool_calls is None and self.cost_per_call == 0:
            raise ValueError(
                "set max_tool_calls (the hard cutoff: -1 past N calls) or cost_per_call (a soft cost per call past free_calls), or both"
            )
        return self


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
        if self.max_tool_calls is not None and n > self.max_tool_calls:
            return Grade(
                OVER_BUDGET,
                {"tool_calls": float(n)},
                {"over_budget": True, "max_tool_calls": self.max_tool_calls},
            )
        return None

    def _within(self, inner: Grade, sample: Mapping[str, Any]) -> Grade:
        n = count_tool_calls(sample)
        cost = self.spec.cost_per_call * max(0, n - self.spec.free_calls)
        sub = {"tool_calls": float(n), "tool_cost": cost, self.inner.name: inner.score}
        sub.update({f"{self.inner.name}.{k}": v for k, v in inner.sub_scores.items()})
        return Grade(
            inner.score - cost,
            sub if inner.error is None else {},
            {**inner.metrics, "over_budget": False},
            inner.error,
        )

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return self._over(sample) or self._within(self.inner.grade(sample, item, trace_id), sample)

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        return self._over(sample) or self._within(
            await self.inner.agrade(sample, item, trace_id), sample
        )


def build(spec: ToolBudgetSpec, path: str, ctx: BuildContext) -> ToolBudgetGrader:
    return ToolBudgetGrader(spec, ctx.child(spec.grader, f"{path}.grader"))
