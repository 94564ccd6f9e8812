"""The dashboard at `/`: the caller's jobs, and per job its live reward and eval curves,
tool calls per rollout before and after, stop reasons, the latest trajectories (each
expands to every turn and tool call) and cancel / pause / resume buttons.

The page is built from the HTML report's parts (`agentrft.evaluate.report`), from what the
run directory holds: `metrics.jsonl` and `rollouts/*.jsonl`. "Before" is the first
evaluation (step 0, the base model) and "after" the latest one; a job without a
validation file compares its first and latest training steps instead. A running job's
page reloads itself every few seconds.

A browser cannot send a Bearer header, so the dashboard takes the API key once
(`/?key=KEY`, or the form it shows) and keeps it in a same-site cookie.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from agentrft.serve.protocol import RequestError
from agentrft.service.state import caller, state_of
from agentrft.service.store import TERMINAL

router = APIRouter()
REFRESH_S = 5
MAX_TRAJECTORIES = 6
_STEP_FILE = re.compile(r"^(eval-)?step-(\d+)\.jsonl$")
_EXTRA_CSS = """
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:13px;background:#e5e7eb}
.status-running{background:#dbeafe}.status-succeeded{background:#dcfce7}.status-failed{background:#fee2e2}.status-paused,.status-queued,.status-validating_files{background:#fef3c7}
form.inline{display:inline} button{font:inherit;padding:3px 12px;margin-right:6px;border-radius:6px;border:1px solid #c9ced8;background:#fff;cursor:pointer}
button.danger{border-color:#dc2626;color:#b91c1c} .error{color:#b91c1c} a{color:#1d4ed8}
details.rollout>summary{cursor:pointer;padding:4px 0}
"""


def _page(title: str, body: str, refresh: bool = False) -> str:
    from agentrft.evaluate.report import CSS, escape

    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{meta}<title>{escape(title)}</title>'
        f"<style>{CSS}{_EXTRA_CSS}</style></head><body>{body}</body></html>"
    )


def _login_page(message: str = "") -> str:
    from agentrft.evaluate.report import escape

    note = f'<p class="error">{escape(message)}</p>' if message else ""
    return _page(
        "agentrft service",
        f'<h1>agentrft service</h1><section><h2>API key</h2>{note}<form method="get" action="/">'
        '<input name="key" type="password" size="40" placeholder="sk-..."> <button type="submit">Open the dashboard</button></form></section>',
    )


def _owner(request: Request) -> tuple[str | None, str | None]:
    """(owner, key to remember in the cookie) for a dashboard request; (None, None) when the
    caller has not given a valid key yet."""
    key = request.query_params.get("key")
    if key:
        try:
            return caller_with_key(request, key), key
        except RequestError:
            return None, None
    try:
        return caller(request), None
    except RequestError:
        return None, None


def caller_with_key(request: Request, key: str) -> str:
    from agentrft.service.state import owner_of_key

    keys = state_of(request).api_keys
    if keys and key not in keys:
        raise RequestError("Incorrect API key provided.", None, "invalid_api_key", 401)
    return owner_of_key(key) if keys else caller(request)


def _respond(html: str, key: str | None, status: int = 200) -> HTMLResponse:
    response = HTMLResponse(html, status_code=status)
    if key:
        response.set_cookie("agentrft_key", key, httponly=True, samesite="strict")
    return response


# -- reading a run directory ---------------------------------------------------------------
def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line being written right now
    return out


def rollout_files(run_dir: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    """(training step files, eval files), each sorted by step."""
    train: list[tuple[int, Path]] = []
    evals: list[tuple[int, Path]] = []
    for path in (run_dir / "rollouts").glob("*.jsonl"):
        m = _STEP_FILE.match(path.name)
        if m:
            (evals if m.group(1) else train).append((int(m.group(2)), path))
    return sorted(train), sorted(evals)


def before_after(run_dir: Path) -> tuple[str, list[dict[str, Any]], str, list[dict[str, Any]]]:
    """Labels and rollout records of the "before" and "after" sides of the comparison."""
    train, evals = rollout_files(run_dir)
    series, kind = (evals, "eval") if evals else (train, "training")
    if not series:
        return "before", [], "after", []
    first, last = series[0], series[-1]
    before = (f"{kind} at step {first[0]}", _records(first[1]))
    after = (
        (f"{kind} at step {last[0]}", _records(last[1])) if last[0] != first[0] else ("after", [])
    )
    return before[0], before[1], after[0], after[1]


def stop_reasons_table(columns: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    from agentrft.evaluate.report import escape

    counts = {
        label: Counter(str(r.get("stop_reason", "?")) for r in recs)
        for label, recs in columns.items()
        if recs
    }
    if not counts:
        return '<p class="missing">No rollouts yet.</p>'
    reasons = sorted({r for c in counts.values() for r in c})
    head = "".join(f"<th>{escape(label)}</th>" for label in counts)
    rows = "".join(
        f"<tr><td>{escape(r)}</td>"
        + "".join(f"<td>{c.get(r, 0)}</td>" for c in counts.values())
        + "</tr>"
        for r in reasons
    )
    return f'<table class="stop-reasons"><tr><th>stop reason</th>{head}</tr>{rows}</table>'


def _buttons(job_id: str, status: str) -> str:
    actions = []
    if status in ("queued", "running"):
        actions.append(("pause", "Pause", ""))
    if status == "paused":
        actions.append(("resume", "Resume", ""))
    if status not in TERMINAL:
        actions.append(("cancel", "Cancel", "danger"))
    return "".join(
        f'<form class="inline" method="post" action="/dashboard/jobs/{job_id}/{a}"><button class="{cls}" type="submit">{label}</button></form>'
        for a, label, cls in actions
    )


def job_page(row: Mapping[str, Any], job: Mapping[str, Any], run_dir: Path) -> str:
    """One job's page (see the module docstring)."""
    from agentrft.evaluate.report import (
        escape,
        image_html,
        pipeline_html,
        reward_curve_png,
        tool_call_counts,
        tool_calls_png,
        trajectory_html,
    )
    from agentrft.train.observe import read_metrics

    metrics = read_metrics(run_dir)
    before_label, before, after_label, after = before_after(run_dir)
    train, _ = rollout_files(run_dir)
    recent = _records(train[-1][1])[:MAX_TRAJECTORIES] if train else []
    status = str(job["status"])
    facts = [
        ("status", f'<span class="status status-{escape(status)}">{escape(status)}</span>'),
        ("model", escape(job["model"])),
        ("fine-tuned model", escape(job["fine_tuned_model"] or "-")),
        ("training file", escape(job["training_file"])),
        ("steps logged", str(len([m for m in metrics if m.get("step", 0) > 0]))),
    ]
    if job.get("error"):
        facts.append(("error", f'<span class="error">{escape(job["error"]["message"])}</span>'))
    table = "<table>" + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in facts) + "</table>"
    last = next((m for m in reversed(metrics) if "reward/mean" in m), None)
    summary = (
        f"<p>latest training reward {last['reward/mean']:.3f} at step {last['step']}</p>"
        if last
        else ""
    )
    hist = tool_calls_png(tool_call_counts(before), tool_call_counts(after))
    trajectories = (
        "".join(
            f'<details class="rollout"><summary>{escape(r.get("trace_id", "rollout"))}: reward '
            f"{r['reward'] if isinstance(r.get('reward'), int | float) else '-'}, {r.get('num_tool_calls', 0)} tool calls, stop {escape(r.get('stop_reason', '?'))}</summary>"
            f"{trajectory_html(r)}</details>"
            for r in recent
        )
        or '<p class="missing">No rollouts yet.</p>'
    )
    sections = [
        ("job", "Job", table + summary + _buttons(str(job["id"]), status)),
        (
            "reward-curve",
            "Reward and eval reward during training",
            image_html(
                reward_curve_png(metrics), "reward curve", "No training step has finished yet."
            ),
        ),
        ("pipeline", "Steps: time, trainer idle and staleness", pipeline_html(metrics)),
        (
            "tool-calls",
            f"Tool calls per rollout: {before_label} vs {after_label}",
            image_html(hist, "tool calls per rollout", "No rollouts yet."),
        ),
        (
            "stop-reasons",
            "Stop reasons",
            stop_reasons_table({before_label: before, after_label: after}),
        ),
        (
            "trajectories",
            f"Latest trajectories (step {train[-1][0]})" if train else "Latest trajectories",
            trajectories,
        ),
    ]
    body = "".join(
        f'<section id="{sid}"><h2>{escape(head)}</h2>{content}</section>'
        for sid, head, content in sections
    )
    return _page(
        f"{job['id']} - agentrft",
        f'<p><a href="/">all jobs</a></p><h1>{escape(job["id"])}</h1>{body}',
        refresh=status not in TERMINAL,
    )


def jobs_page(jobs: Sequence[Mapping[str, Any]], last_rewards: Mapping[str, float | None]) -> str:
    from agentrft.evaluate.report import escape

    rows = "".join(
        f'<tr><td><a href="/dashboard/jobs/{escape(j["id"])}">{escape(j["id"])}</a></td><td><span class="status status-{escape(j["status"])}">{escape(j["status"])}</span></td>'
        f"<td>{escape(j['model'])}</td><td>{escape(j['fine_tuned_model'] or '-')}</td>"
        f"<td>{'-' if last_rewards.get(j['id']) is None else format(last_rewards[j['id']], '.3f')}</td></tr>"
        for j in jobs
    )
    table = (
        f'<table id="jobs"><tr><th>job</th><th>status</th><th>model</th><th>fine-tuned model</th><th>latest reward</th></tr>{rows}</table>'
        if jobs
        else '<p class="missing">No fine-tuning jobs yet. Create one with client.fine_tuning.jobs.create(...).</p>'
    )
    running = any(j["status"] not in TERMINAL for j in jobs)
    return _page(
        "agentrft service",
        f"<h1>agentrft service</h1><section><h2>Fine-tuning jobs</h2>{table}</section>",
        refresh=running,
    )


# -- routes -----------------------------------------------------------------------------------
@router.get("/", response_class=HTMLResponse)
async def index(request: Request) -> Response:
    from agentrft.service.jobs import job_object

    owner, key = _owner(request)
    if owner is None:
        return _respond(
            _login_page("That API key is not valid." if request.query_params.get("key") else ""),
            None,
            401 if request.query_params.get("key") else 200,
        )
    state = state_of(request)
    rows = state.store.jobs(owner, limit=100)
    jobs = [job_object(state, r) for r in rows]
    last: dict[str, float | None] = {}
    for j in jobs:
        path = state.jobs_dir / j["id"] / "metrics.jsonl"
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []
        try:
            last[j["id"]] = json.loads(lines[-1]).get("reward/mean") if lines else None
        except json.JSONDecodeError:
            last[j["id"]] = None
    return _respond(jobs_page(jobs, last), key)


@router.get("/dashboard/jobs/{job_id}", response_class=HTMLResponse)
async def job_view(request: Request, job_id: str) -> Response:
    from agentrft.service.jobs import job_object

    owner, key = _owner(request)
    if owner is None:
        return _respond(_login_page(), None)
    state = state_of(request)
    row = state.store.job(job_id, owner)
    if row is None:
        return _respond(
            _page("not found", f"<h1>No such fine-tuning job: {job_id[:64]}</h1>"), key, 404
        )
    html = await run_in_threadpool(job_page, row, job_object(state, row), state.jobs_dir / job_id)
    return _respond(html, key)


@router.post("/dashboard/jobs/{job_id}/{action}")
async def job_action(request: Request, job_id: str, action: str) -> Response:
    from agentrft.service.jobs import resume_job, stop_job

    if action == "resume":
        await resume_job(request, job_id)
    elif action in ("cancel", "pause"):
        await stop_job(request, job_id, "cancelled" if action == "cancel" else "paused")
    else:
        raise RequestError(
            f"unknown action {action!r}: cancel, pause or resume", "action", "invalid_value"
        )
    return RedirectResponse(f"/dashboard/jobs/{job_id}", status_code=303)
