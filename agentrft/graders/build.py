"""Grader JSON -> a validated grader tree. The one entry point from job and CLI.

`validate_grader` checks the JSON alone; `build_grader` also resolves what grading will
need (the judge model, its API key variable) and returns a ready `Grader`. Both raise
`ConfigError` naming the field path (`grader.graders.style.input[1].content`) and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrft.config import load_mapping_file
from agentrft.errors import ConfigError
from agentrft.graders import (
    endpoint,
    fact_recall,
    file_f1,
    model,
    multi,
    python,
    string_check,
    text_similarity,
    tool_budget,
)
from agentrft.graders.protocol import Grader
from agentrft.graders.spec import BuildContext, parse_spec

# type -> (spec model, builder)
FAMILIES: dict[str, tuple[type[Any], Callable[[Any, str, BuildContext], Any]]] = {
    "string_check": (string_check.StringCheckSpec, string_check.build),
    "text_similarity": (text_similarity.TextSimilaritySpec, text_similarity.build),
    "score_model": (model.ScoreModelSpec, model.build),
    "label_model": (model.LabelModelSpec, model.build),
    "python": (python.PythonSpec, python.build),
    "multi": (multi.MultiSpec, multi.build),
    "endpoint": (endpoint.EndpointSpec, endpoint.build),
    "file_f1": (file_f1.FileF1Spec, file_f1.build),
    "fact_recall": (fact_recall.FactRecallSpec, fact_recall.build),
    "tool_budget": (tool_budget.ToolBudgetSpec, tool_budget.build),
}
KNOWN_TYPES = tuple(FAMILIES)


def _build(spec: Any, path: str, ctx: BuildContext) -> Grader:
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f'{path}: a grader must be a JSON object with a "type", got {type(spec).__name__}'
        )
    kind = spec.get("type")
    if kind not in FAMILIES:
        got = 'no "type"' if kind is None else f"unknown type {kind!r}"
        raise ConfigError(f"{path}: {got}; known grader types: {', '.join(KNOWN_TYPES)}")
    spec_model, builder = FAMILIES[kind]
    return builder(parse_spec(spec_model, dict(spec), path), path, ctx)


def build_grader(
    spec: Mapping[str, Any],
    *,
    judge: Any = None,
    python_limits: Any = None,
    check_resources: bool = True,
) -> Grader:
    """A ready grader for `spec` (OpenAI grader JSON, or an agentrft addition).

    judge: a `JudgeConfig` or its dict (the job's `agentrft.judge`) for model graders.
    python_limits: an `agentrft.sandbox.Limits` for python graders (default: OpenAI's).
    check_resources: False to check the JSON only (see validate_grader).
    """
    ctx = BuildContext(
        judge=judge, python_limits=python_limits, check_resources=check_resources, build=_build
    )
    return _build(spec, "grader", ctx)


def validate_grader(spec: Mapping[str, Any]) -> Grader:
    """Validate grader JSON without looking anything up (no model, key or sandbox)."""
    return build_grader(spec, check_resources=False)


def walk(grader: Any) -> Iterator[Any]:
    """Every grader in a tree, depth first."""
    yield grader
    for child in getattr(grader, "children", ()):
        yield from walk(child)


def tool_call_limit(grader: Any) -> int | None:
    """The smallest `tool_budget.max_tool_calls` anywhere in the tree (a soft-cost budget
    sets none), or None. Rollouts
    stop once they ask for more calls than this (`agentrft.runtime.tool_call_cap`): their
    grade is -1 anyway."""
    limits = [
        g.max_tool_calls
        for g in walk(grader)
        if getattr(g, "type", None) == "tool_budget" and g.max_tool_calls is not None
    ]
    return min(limits) if limits else None


def load_grader_spec(path: str | Path) -> dict[str, Any]:
    """Grader JSON from a file holding the grader itself, an OpenAI validate/run payload
    (`{"grader": ...}`), or a whole job (JSON or YAML, `method.reinforcement.grader`)."""
    data = load_mapping_file(path, "grader")
    if isinstance(data, dict) and "grader" in data and "type" not in data:
        data = data["grader"]
    elif isinstance(data, dict) and "method" in data:
        try:
            data = data["method"]["reinforcement"]["grader"]
        except (KeyError, TypeError):
            raise ConfigError(f"{path}: a job file needs method.reinforcement.grader") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a grader object, got {type(data).__name__}")
    return data
