"""`/v1/fine_tuning/jobs`: create, list, retrieve, cancel, pause, resume, events, checkpoints.

A job request is OpenAI's reinforcement job plus the `agentrft` key (the SDK sends it with
`extra_body`). It is checked with the same models `agentrft train` uses (`agentrft.job`),
so a bad request fails with the field and the fix before it is queued. The service adds
two rules of its own: tools are HTTP endpoints with an absolute `server_url` and MCP servers
are reached at an absolute `url` (the service runs no user code), and `agentrft.environment`
and stdio MCP servers (`command`) are refused for the same reason.

Each job gets a run directory `DATA/jobs/JOB_ID` laid out as `agentrft train` lays it out
(job.json, run.json, metrics.jsonl, checkpoints/, final/), with its own copy of the
datasets, so `agentrft report` and `serve-model` work on it as on any run.

Secrets (tool and grader header values, URL credentials) are kept only in the encrypted
secret store (`secret_store.py`): the database, every response and the dashboard see them
masked as OpenAI masks keys, and the run directory's job.json has them redacted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from agentrft.errors import ConfigError, ModelNotFoundError
from agentrft.redact import mask_job
from agentrft.serve.protocol import RequestError
from agentrft.service.state import (
    ServiceState,
    caller,
    json_body,
    list_page,
    page_limit,
    required,
    state_of,
)
from agentrft.service.store import new_id
from agentrft.train.run_files import write_run_files

router = APIRouter()
ORGANIZATION = "org-agentrft"


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# -- checking a job request ---------------------------------------------------------------
def _training_file(
    state: ServiceState, owner: str, body: dict[str, Any], key: str
) -> dict[str, Any] | None:
    file_id = body.get(key)
    if file_id is None and key == "validation_file":
        return None
    if not isinstance(file_id, str):
        raise RequestError(
            f"Missing required parameter: '{key}'"
            if file_id is None
            else f"{key} must be a file id",
            key,
            "missing_required_parameter",
        )
    row = state.store.file(file_id, owner)
    if row is None:
        raise RequestError(f"invalid {key}: {file_id} (no such file)", key, f"invalid_{key}", 400)
    if row["purpose"] != "fine-tune":
        raise RequestError(
            f"{file_id} has purpose '{row['purpose']}'; fine-tuning needs a file uploaded with purpose 'fine-tune'",
            key,
            "invalid_file_purpose",
        )
    return row


def _check_service_rules(body: dict[str, Any]) -> None:
    method = required(
        body, "method", dict, hint="{type: reinforcement, reinforcement: {grader, tools, ...}}"
    )
    if method.get("type") != "reinforcement":
        raise RequestError(
            f"method.type {method.get('type')!r} is not supported: agentrft trains with the reinforcement method",
            "method.type",
            "invalid_value",
        )
    rl = required(method, "reinforcement", dict, "method.reinforcement")
    if "grader" not in rl:
        raise RequestError(
            "Missing required parameter: 'method.reinforcement.grader'",
            "method.reinforcement.grader",
            "missing_required_parameter",
        )
    from agentrft.graders import validate_grader

    try:
        validate_grader(rl["grader"])
    except ConfigError as exc:
        raise RequestError(
            f"invalid grader: {exc}", "method.reinforcement.grader", "invalid_grader"
        ) from None
    tools = rl.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(
            "method.reinforcement.tools must be a list",
            "method.reinforcement.tools",
            "invalid_value",
        )
    for i, tool in enumerate(tools):
        where = f"method.reinforcement.tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(f"{where} must be an object", where, "invalid_value")
        url = tool.get("server_url")
        if tool.get("function") is not None:
            raise RequestError(
                f"{where}: the service calls tools over HTTP only; give `server_url` instead of `function`",
                f"{where}.function",
                "invalid_value",
            )
        if not url:
            raise RequestError(
                f"{where} ({tool.get('name', '?')}): missing `server_url`, the tool's HTTP endpoint",
                f"{where}.server_url",
                "missing_required_parameter",
            )
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise RequestError(
                f"{where}.server_url must be an absolute http(s) URL, got {url!r}",
                f"{where}.server_url",
                "invalid_value",
            )
    ext = body.get("agentrft")
    for i, server in enumerate((ext.get("mcp_servers") or []) if isinstance(ext, dict) else []):
        _check_mcp_server(server, f"agentrft.mcp_servers[{i}]")
    if isinstance(ext, dict) and ext.get("environment") is not None:
        raise RequestError(
            "agentrft.environment is not available in the service: run your tool server yourself and give absolute `server_url`s",
            "agentrft.environment",
            "invalid_value",
        )


def _check_mcp_server(server: Any, where: str) -> None:
    """The service reaches MCP servers over HTTP only: it starts no stdio server."""
    if not isinstance(server, dict):
        raise RequestError(f"{where} must be an object", where, "invalid_value")
    if server.get("command") is not None:
        raise RequestError(
            f"{where}: the service starts no stdio MCP server (`command`); run it yourself behind streamable HTTP and give its `url`",
            f"{where}.command",
            "invalid_value",
        )
    url = server.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise RequestError(
            f"{where}.url must be the absolute http(s) URL of a streamable-HTTP MCP server, got {url!r}",
            f"{where}.url",
            "invalid_value",
        )


def build_job(
    state: ServiceState, owner: str, body: dict[str, Any], run_dir: Path
) -> tuple[Any, dict[str, Any]]:
    """The validated Job (datasets pointing at the run directory's copies) and the file rows."""
    from agentrft.job import Job, format_validation_error, job_from_dict

    _check_service_rules(body)
    train_row = _training_file(state, owner, body, "training_file")
    val_row = _training_file(state, owner, body, "validation_file")
    data = {k: v for k, v in body.items() if k not in ("training_file", "validation_file")}
    data["training_file"] = "training.jsonl"
    if val_row is not None:
        data["validation_file"] = "validation.jsonl"
    try:
        Job.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RequestError(
            format_validation_error("job", exc), _loc(tuple(err["loc"])) or None, "invalid_value"
        ) from None
    job = job_from_dict(data, source=run_dir.name, base_dir=run_dir)
    try:
        check_model(job.model)
    except ModelNotFoundError as exc:
        raise RequestError(
            f"The model {job.model!r} does not exist or you do not have access to it. ({exc})",
            "model",
            "model_not_found",
        ) from None
    return job, {"training": train_row, "validation": val_row}


def check_model(name: str) -> None:
    """That `name` is a model this machine has, without loading or converting it."""
    from agentrft.policy.models import DEFAULT_MODEL, embedded_gguf

    if name == DEFAULT_MODEL:
        embedded_gguf(name)
        return
    path = Path(name).expanduser()
    if not ((path.is_file() and path.suffix == ".gguf") or (path / "config.json").is_file()):
        raise ModelNotFoundError(
            f"use {DEFAULT_MODEL!r}, a transformers model directory or a .gguf file on the server"
        )


def fine_tuned_model_id(model: str, suffix: str | None, job_id: str) -> str:
    """OpenAI's `ft:BASE:ORG:SUFFIX:ID` form."""
    return f"ft:{model}:agentrft:{suffix or ''}:{job_id.removeprefix('ftjob-')[:8]}"


# -- shapes ---------------------------------------------------------------------------------
def job_object(state: ServiceState, row: dict[str, Any]) -> dict[str, Any]:
    req = json.loads(row["request"])
    method = req.get("method") or {}
    hp = dict(((method.get("reinforcement") or {}).get("hyperparameters")) or {})
    resolved = _resolved(state.jobs_dir / row["id"])
    hyper = {k: resolved.get(k, hp.get(k, "auto")) for k in ("batch_size", "n_epochs")}
    hyper["learning_rate_multiplier"] = hp.get("learning_rate_multiplier", "auto")
    if resolved and hyper["learning_rate_multiplier"] == "auto":
        hyper["learning_rate_multiplier"] = 1.0
    succeeded = row["status"] == "succeeded"
    return {
        "id": row["id"],
        "object": "fine_tuning.job",
        "created_at": row["created_at"],
        "error": json.loads(row["error"]) if row["error"] else None,
        "fine_tuned_model": row["fine_tuned_model"] if succeeded else None,
        "finished_at": row["finished_at"],
        "hyperparameters": hyper,
        "model": req.get("model") or _default_model(),
        "organization_id": ORGANIZATION,
        "result_files": [],
        "seed": int(req.get("seed") or 0),
        "status": row["status"],
        "trained_tokens": _trained_tokens(state.jobs_dir / row["id"]) if succeeded else None,
        "training_file": req.get("training_file"),
        "validation_file": req.get("validation_file"),
        "estimated_finish": None,
        "integrations": req.get("integrations"),
        "metadata": req.get("metadata"),
        "method": {**method, "type": method.get("type", "reinforcement")},
        "user_provided_suffix": req.get("suffix"),
        "agentrft": req.get("agentrft"),
    }


def _default_model() -> str:
    from agentrft.job import DEFAULT_MODEL

    return DEFAULT_MODEL


def _trained_tokens(run_dir: Path) -> int:
    """Tokens the updates trained on, over all steps (`train/tokens` in metrics.jsonl)."""
    return int(sum(float(m.get("train/tokens", 0)) for m in read_metrics_by_step(run_dir).values()))


def _resolved(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "hyperparameters.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return {}


def event_object(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "fine_tuning.job.event",
        "created_at": row["created_at"],
        "level": row["level"],
        "message": row["message"],
        "data": json.loads(row["data"]) if row["data"] else None,
        "type": row["type"],
    }


def read_metrics_by_step(run_dir: Path) -> dict[int, dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[int(row.get("step", 0))] = row
    return rows


def checkpoint_objects(state: ServiceState, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's checkpoints, newest first (`checkpoints/step-N`, complete ones only)."""
    run_dir = state.jobs_dir / row["id"]
    metrics = read_metrics_by_step(run_dir)
    out = []
    steps = sorted(
        (int(p.name.removeprefix("step-")), p)
        for p in (run_dir / "checkpoints").glob("step-*")
        if p.is_dir() and p.name[5:].isdigit()
    )
    short = row["id"].removeprefix("ftjob-")
    for step, path in reversed(steps):
        m = metrics.get(step, {})
        out.append(
            {
                "id": f"ftckpt-{short}-{step}",
                "object": "fine_tuning.job.checkpoint",
                "created_at": int(path.stat().st_mtime),
                "fine_tuned_model_checkpoint": f"{row['fine_tuned_model']}:ckpt-step-{step}",
                "fine_tuning_job_id": row["id"],
                "step_number": step,
                "metrics": {
                    "step": float(step),
                    "train_reward": m.get("reward/mean"),
                    "valid_reward": m.get("eval/reward/mean"),
                    "train_loss": m.get("loss"),
                    **{k: v for k, v in m.items() if k != "step"},
                },
            }
        )
    return out


# -- routes -----------------------------------------------------------------------------------
def owned_job(request: Request, job_id: str) -> dict[str, Any]:
    row = state_of(request).store.job(job_id, caller(request))
    if row is None:
        raise RequestError(
            f"No such fine-tuning job: {job_id}",
            "fine_tuning_job_id",
            "fine_tuning_job_not_found",
            404,
        )
    return row


@router.post("/v1/fine_tuning/jobs")
async def create_job(request: Request) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    body = await json_body(request)
    job_id = new_id("ftjob")
    run_dir = state.jobs_dir / job_id
    job, files = await run_in_threadpool(build_job, state, owner, body, run_dir)
    run_dir.mkdir(parents=True)
    shutil.copyfile(state.files_dir / files["training"]["id"], run_dir / "training.jsonl")
    if files["validation"] is not None:
        shutil.copyfile(state.files_dir / files["validation"]["id"], run_dir / "validation.jsonl")
    # the layout `agentrft train` writes (secrets redacted), so `report` and `serve-model` read
    # it; the job in full goes to the encrypted secret store, for the worker alone
    state.secrets.put(job_id, job.model_dump(mode="json"))
    write_run_files(run_dir, job, job_id, run_dir)
    validating = f"Validating training file: {body['training_file']}" + (
        f" and validation file: {body['validation_file']}" if body.get("validation_file") else ""
    )
    row = state.store.add_job(
        job_id,
        owner,
        mask_job(body),  # the database and every response see the secrets masked
        fine_tuned_model_id(job.model, job.suffix, job_id),
        (f"Created fine-tuning job: {job_id}", validating),
    )
    state.executor.poke()
    return job_object(state, row)


@router.get("/v1/fine_tuning/jobs")
async def list_jobs(request: Request) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    limit = page_limit(request)
    metadata = {
        k[len("metadata[") : -1]: v
        for k, v in request.query_params.items()
        if k.startswith("metadata[") and k.endswith("]")
    }
    rows = state.store.jobs(owner, request.query_params.get("after"), limit + 1, metadata)
    page = list_page([job_object(state, r) for r in rows], limit)
    return {k: page[k] for k in ("object", "data", "has_more")}


@router.get("/v1/fine_tuning/jobs/{job_id}")
async def retrieve_job(request: Request, job_id: str) -> dict[str, Any]:
    return job_object(state_of(request), owned_job(request, job_id))


async def stop_job(request: Request, job_id: str, status: str) -> dict[str, Any]:
    row = owned_job(request, job_id)
    state = state_of(request)
    allowed = (
        ("validating_files", "queued", "running", "paused")
        if status == "cancelled"
        else ("queued", "running")
    )
    if row["status"] not in allowed:
        verb = "cancel" if status == "cancelled" else "pause"
        raise RequestError(
            f"Cannot {verb} a job whose status is {row['status']!r}", None, "invalid_job_state"
        )
    state.executor.stop(job_id, status)
    await run_in_threadpool(state.executor.wait_stopped, job_id)
    return job_object(state, state.store.job(job_id) or row)


@router.post("/v1/fine_tuning/jobs/{job_id}/cancel")
async def cancel_job(request: Request, job_id: str) -> dict[str, Any]:
    return await stop_job(request, job_id, "cancelled")


@router.post("/v1/fine_tuning/jobs/{job_id}/pause")
async def pause_job(request: Request, job_id: str) -> dict[str, Any]:
    return await stop_job(request, job_id, "paused")


@router.post("/v1/fine_tuning/jobs/{job_id}/resume")
async def resume_job(request: Request, job_id: str) -> dict[str, Any]:
    row = owned_job(request, job_id)
    state = state_of(request)
    if row["status"] != "paused":
        raise RequestError(
            f"Cannot resume a job whose status is {row['status']!r}; only a paused job resumes",
            None,
            "invalid_job_state",
        )
    if state.store.set_status(job_id, "queued", only_from=("paused",)):
        state.store.add_event(
            job_id, "Fine-tuning job resumed; it continues from its last checkpoint"
        )
    resumed = job_object(
        state, state.store.job(job_id) or row
    )  # as queued, before a worker may pick it up
    state.executor.poke()
    return resumed


@router.get("/v1/fine_tuning/jobs/{job_id}/events")
async def list_events(request: Request, job_id: str) -> dict[str, Any]:
    owned_job(request, job_id)
    state = state_of(request)
    limit = page_limit(request)
    rows = state.store.events(job_id, request.query_params.get("after"), limit + 1)
    page = list_page([event_object(r) for r in rows], limit)
    return {k: page[k] for k in ("object", "data", "has_more")}


@router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints")
async def list_checkpoints(request: Request, job_id: str) -> dict[str, Any]:
    row = owned_job(request, job_id)
    limit = page_limit(request, default=10)
    items = checkpoint_objects(state_of(request), row)
    after = request.query_params.get("after")
    if after:
        ids = [c["id"] for c in items]
        items = items[ids.index(after) + 1 :] if after in ids else items
    return list_page(items[: limit + 1], limit)


def validate_job_files(jobs_dir: Path) -> Any:
    """The executor's check of a new job: its dataset copies still load."""

    def check(row: dict[str, Any]) -> dict[str, Any] | None:
        from agentrft.data import load_dataset

        run_dir = jobs_dir / row["id"]
        for name, param in (
            ("training.jsonl", "training_file"),
            ("validation.jsonl", "validation_file"),
        ):
            path = run_dir / name
            if param == "validation_file" and not path.exists():
                continue
            try:
                load_dataset(path)
            except ConfigError as exc:
                return {
                    "code": f"invalid_{param}",
                    "message": str(exc).replace(str(run_dir) + os.sep, ""),
                    "param": param,
                }
        return None

    return check
