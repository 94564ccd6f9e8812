"""The report's check sections: the doctor's verdicts (`doctor.json`) and the hack watch's flags
(`hack_watch.jsonl` / `hack_watch/*` in metrics.jsonl) with links to each step's readings.
Plain data in, HTML out; `report.py` places them on the page."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_COLOURS = {"pass": "#16a34a", "warn": "#d97706", "fail": "#dc2626", "skip": "#8a93a3"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def doctor_html(report: Mapping[str, Any] | None) -> str:
    if not report:
        return '<p class="missing">No doctor report was given (run `agentrft doctor JOB`).</p>'
    rows = "".join(
        f"<tr><td>{_e(c['rule'])}</td>"
        f'<td style="color:{_COLOURS.get(c["status"], "#000")};font-weight:700">{_e(c["status"].upper())}</td>'
        f'<td style="text-align:left">{"<br>".join(_e(x) for x in c["evidence"])}</td>'
        f'<td style="text-align:left">{"<br>".join(_e(x) for x in c["fix"]) or "-"}</td></tr>'
        for c in report.get("checks", [])
    )
    head = f"<p>{_e(report.get('job', ''))}: {_e(report.get('rows'))} rows x {_e(report.get('k'))} base rollouts, {float(report.get('wall_s') or 0):.0f} s</p>"
    return (
        head
        + "<table><tr><th>rule</th><th>verdict</th><th>evidence</th><th>fix</th></tr>"
        + rows
        + "</table>"
    )


def hack_watch_html(
    metrics: Sequence[Mapping[str, Any]],
    flags: Sequence[Mapping[str, Any]],
    readings: Mapping[int, str],
) -> str:
    """Flags per step, and each step's readings (top-rewarded and random rollout) linked."""
    watched = [m for m in metrics if "hack_watch/flags" in m]
    if not watched and not flags:
        return '<p class="missing">No hack-watch data in this run (metrics.jsonl has no hack_watch/ keys).</p>'
    by_step: dict[int, list[str]] = {}
    for f in flags:
        by_step.setdefault(int(f.get("step", 0)), []).append(f"{f.get('kind')}: {f.get('message')}")
    n = sum(len(v) for v in by_step.values())
    summary = (
        f'<p style="color:#dc2626;font-weight:700">{n} flag(s): read the rollouts of the flagged steps.</p>'
        if n
        else "<p>No flag was raised.</p>"
    )
    steps = sorted({int(m.get("step", 0)) for m in watched} | set(by_step) | set(readings))

    def link(s: int) -> str:
        return f'<a href="{_e(readings[s])}">top + random rollout</a>' if s in readings else "-"

    rows = "".join(
        f"<tr><td>{s}</td>"
        f'<td style="text-align:left">{"<br>".join(_e(x) for x in by_step.get(s, [])) or "-"}</td>'
        f"<td>{link(s)}</td></tr>"
        for s in steps
    )
    return (
        summary + "<table><tr><th>step</th><th>flags</th><th>readings</th></tr>" + rows + "</table>"
    )


def hack_flags(run_dir: str | Path | None) -> list[dict[str, Any]]:
    """The hack watch's flags of a run (its hack_watch.jsonl), oldest first."""
    f = Path(run_dir) / "hack_watch.jsonl" if run_dir else None
    if f is None or not f.is_file():
        return []
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]


def reading_pages(run_dir: str | Path | None, page_dir: Path) -> dict[int, str]:
    """step -> the readings page's path relative to the report."""
    if not run_dir:
        return {}
    return {
        int(p.stem.rsplit("-", 1)[1]): os.path.relpath(p, page_dir)
        for p in (Path(run_dir) / "readings").glob("step-*.html")
    }
