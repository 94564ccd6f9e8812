"""`/v1/fine_tuning/alpha/graders/validate` and `/run`: OpenAI's grader test API, with the
same code as `agentrft grader validate|run` (`agentrft.cli.graders`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from agentrft.errors import AgentRFTError, ConfigError
from agentrft.serve.protocol import RequestError
from agentrft.service.state import caller, json_body, required

router = APIRouter()
# OpenAI's error flags that agentrft's graders never raise; the SDK's type lists them all
OPENAI_FLAGS = (
    "formula_parse_error",
    "invalid_variable_error",
    "model_grader_parse_error",
    "model_grader_refusal_error",
    "model_grader_server_error",
    "other_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "sample_parse_error",
    "truncated_observation_error",
    "unresponsive_reward_error",
)


def _grader_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = required(body, "grader", dict, hint="an object")
    return spec


@router.post("/v1/fine_tuning/alpha/graders/validate")
async def validate(request: Request) -> dict[str, Any]:
    caller(request)
    spec = _grader_spec(await json_body(request))
    from agentrft.graders import validate_grader

    try:
        validate_grader(spec)
    except ConfigError as exc:
        raise RequestError(f"invalid grader: {exc}", "grader", "invalid_grader") from None
    return {"grader": spec}


def run_grader(
    spec: dict[str, Any], model_sample: str, item: dict[str, Any], trace_id: str
) -> dict[str, Any]:
    from agentrft.graders import build_grader, sample_from_text
    from agentrft.graders.protocol import run_response

    try:
        grader = build_grader(spec)
    except ConfigError as exc:
        raise RequestError(f"invalid grader: {exc}", "grader", "invalid_grader") from None
    except AgentRFTError as exc:  # e.g. no sandbox for a python grader on this server
        raise RequestError(str(exc), "grader", "grader_unavailable") from None
    grade = grader.grade(sample_from_text(model_sample), item, trace_id)
    resp = run_response(grader, grade)
    errors = resp["metadata"]["errors"]
    for flag in OPENAI_FLAGS:
        errors.setdefault(flag, False)
    details = grade.metrics.get("error_details") if grade.error else None
    errors.setdefault(
        "python_grader_runtime_error_details",
        details if grade.error == "python_grader_runtime_error" else None,
    )
    errors.setdefault("python_grader_server_error_type", None)
    errors.setdefault(
        "model_grader_server_error_details",
        details if grade.error == "model_grader_server_error" else None,
    )
    resp["metadata"].update({"sampled_model_name": None, "token_usage": None})
    resp["model_grader_token_usage_per_model"] = {}
    return resp


@router.post("/v1/fine_tuning/alpha/graders/run")
async def run(request: Request) -> dict[str, Any]:
    caller(request)
    body = await json_body(request)
    spec = _grader_spec(body)
    sample = required(body, "model_sample", str, hint="the model's output, a string")
    item = body.get("item") or {}
    if not isinstance(item, dict):
        raise RequestError(
            "item must be an object (a dataset row's fields)", "item", "invalid_value"
        )
    item = {k: v for k, v in item.items() if k != "messages"}
    trace_id = str(body.get("trace_id") or "trace_grader_run")
    return await run_in_threadpool(run_grader, spec, sample, item, trace_id)
