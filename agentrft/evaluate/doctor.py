"""`agentrft doctor JOB`: four checks on a job before anyone pays for training, each a verdict
with its evidence and the fix, run on the job's own tools, grader and data.

    1. success is unambiguous  the same rollouts graded twice agree; each row's reference can
                               be reached through the tools; scores on solved rows
    2. data mirrors production training rows against served traffic (evaluate/traffic.py)
    3. best-of-k rises         the pre-flight's best-of-k, pass@k and verdict (evaluate/preflight.py)
    4. reward is not hackable  known-hack probes scored by the grader (evaluate/hack_probes.py):
                               one above the base model's median is a FAIL

One environment serves it all: K base rollouts per row are sampled once, graded twice, and
the probes run on the same rows, so the doctor costs about one pre-flight. It writes
`doctor.json` (and the base rollouts) to its output folder.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from agentrft.evaluate.preflight import Verdict, preflight
from agentrft.graders import grade_groups, reward_of
from agentrft.graders.groups import cleanup_traces
from agentrft.types import Group, Item, Trajectory

AGREE_EPS = 1e-6
MODEL_GRADED = (
    "score_model",
    "label_model",
)  # a judge model decides (and fact_recall with a judge)


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # nothing to check it with (e.g. no served traffic): the fix says how


@dataclass(frozen=True)
class Check:
    """One rule's verdict: what was measured (`evidence`), what to do (`fix`), the numbers."""

    rule: str
    status: Status
    evidence: list[str]
    fix: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


# -- 1. unambiguous success --------------------------------------------------------------
def reference_fields(grader_spec: Mapping[str, Any]) -> list[str]:
    """The item fields the grader's templates name (`{{item.files}}` -> "files")."""
    text = json.dumps(grader_spec)
    return sorted(set(re.findall(r"\{\{\s*item\.([A-Za-z0-9_]+)", text)))


def grader_types(grader_spec: Any) -> set[str]:
    """Every grader type in a (multi) grader tree; "fact_recall" counts as model-graded
    (`score_model`) only when it has a judge."""
    found: set[str] = set()
    if isinstance(grader_spec, Mapping):
        if isinstance(grader_spec.get("type"), str):
            found.add(grader_spec["type"])
            if grader_spec["type"] == "fact_recall" and grader_spec.get("judge"):
                found.add("score_model")
        for v in grader_spec.values():
            found |= grader_types(v)
    elif isinstance(grader_spec, list):
        for v in grader_spec:
            found |= grader_types(v)
    return found


def _parts(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value if str(v).strip()]
    if isinstance(value, str | int | float) and str(value).strip():
        return [str(value)]
    return []


def reached_references(
    item: Item, trajs: Sequence[Trajectory], fields: Sequence[str]
) -> tuple[int, int]:
    """(reference parts seen in some tool output of `trajs`, reference parts) for one row."""
    seen = "\n".join(r.output for t in trajs for r in t.tool_results if r.status == "ok").lower()
    parts = [p for f in fields for p in _parts(item.fields.get(f))]
    return sum(p.lower() in seen for p in parts), len(parts)


def check_success(
    first: Sequence[Group],
    second: Sequence[Group],
    trajs_by_row: Mapping[int, Sequence[Trajectory]],
    grader_spec: Mapping[str, Any],
    threshold: float,
) -> Check:
    graded = [  # discarded rollouts (no grade) stay out; a failed grade is NaN
        (reward_of(a), reward_of(b))
        for g1, g2 in zip(first, second, strict=True)
        for a, b in zip(g1.grades, g2.grades, strict=True)
        if a is not None or b is not None
    ]
    differ = [
        (a, b)
        for a, b in graded
        if math.isnan(a) != math.isnan(b) or (not math.isnan(a) and abs(a - b) > AGREE_EPS)
    ]
    judged = sorted(grader_types(grader_spec) & set(MODEL_GRADED))
    disagreement = len(differ) / len(graded) if graded else 0.0
    max_gap = max((abs(a - b) for a, b in differ if not math.isnan(a - b)), default=0.0)

    fields = reference_fields(grader_spec)
    per_row = {
        g.item.index: reached_references(g.item, trajs_by_row.get(g.item.index, ()), fields)
        for g in first
    }
    with_refs = {row: (hit, n) for row, (hit, n) in per_row.items() if n}
    unreached = sorted(row for row, (hit, _) in with_refs.items() if hit == 0)

    solved = [g for g in first if max(map(reward_of, g.grades), default=-1.0) >= threshold]
    solved_scores = [r for g in solved for r in map(reward_of, g.grades) if not math.isnan(r)]
    spread = (
        {
            "rows": len(solved),
            "min": min(solved_scores),
            "max": max(solved_scores),
            "std": statistics.pstdev(solved_scores),
        }
        if solved_scores
        else {"rows": 0}
    )

    evidence = [
        f"graded twice: {len(differ)} of {len(graded)} rollouts got a different score"
        + (f" (largest gap {max_gap:.3f})" if differ else "")
        + (f"; model-graded: {', '.join(judged)}" if judged else ""),
    ]
    if fields:
        evidence.append(
            f"{len(unreached)} of {len(with_refs)} rows: no part of the reference ({', '.join('item.' + f for f in fields)}) appeared in any tool output of their base and probe rollouts"
            + (f" (rows {', '.join(map(str, unreached[:8]))})" if unreached else "")
        )
    else:
        evidence.append("the grader names no item field, so no reference could be looked for")
    evidence.append(
        f"rows the base solves (reward >= {threshold:g} at least once): {spread['rows']}"
        + (
            f"; their rollouts scored {spread['min']:.3f} .. {spread['max']:.3f} (std {spread['std']:.3f})"
            if spread["rows"]
            else ""
        )
    )
    fix: list[str] = []
    status = Status.PASS
    if differ:
        status = Status.FAIL if disagreement > 0.1 or not judged else Status.WARN
        fix.append(
            "A grader must give the same rollout the same score: set the judge's temperature to 0, "
            "or grade with several samples and average them; a deterministic grader that disagrees with itself has state or randomness to remove."
            if judged
            else "This grader has no judge, yet scored the same rollout differently: it depends on state or randomness (an endpoint grader's per-trace state, a clock); make it a function of the sample and the item."
        )
    share_unreached = len(unreached) / len(with_refs) if with_refs else 0.0
    if share_unreached > 0.2:
        status = Status.FAIL if share_unreached > 0.5 else max(status, Status.WARN, key=_rank)
        fix.append(
            "Check those rows: a reference the tools never return cannot be found by any policy. "
            "Drop the rows, or give the tools a way to reach the answer."
        )
    return Check(
        "unambiguous success",
        status,
        evidence,
        fix,
        {
            "graded_twice": len(graded),
            "disagreements": len(differ),
            "disagreement_share": disagreement,
            "max_gap": max_gap,
            "model_graded": judged,
            "reference_fields": fields,
            "rows_with_reference": len(with_refs),
            "unreached_rows": unreached,
            "solved_rows": spread,
        },
    )


def _rank(s: Status) -> int:
    return [Status.SKIP, Status.PASS, Status.WARN, Status.FAIL].index(s)


# -- 2. data mirrors production ----------------------------------------------------------
def check_traffic(comparison: dict[str, Any] | None, source: str | None) -> Check:
    from agentrft.evaluate.traffic import HOW_TO_COLLECT

    rule = "data mirrors production"
    if comparison is None:
        return Check(rule, Status.SKIP, ["no served traffic was given"], [HOW_TO_COLLECT])
    if not comparison.get("training_rows"):
        return Check(
            rule,
            Status.SKIP,
            [f"{source}: {comparison['requests']} logged requests, none with a user message"],
            [HOW_TO_COLLECT],
            comparison,
        )
    c, ln, tc = comparison, comparison["request_chars"], comparison["tool_calls"]
    evidence = [
        f"{c['usable']} served requests against {c['training_rows']} training rows ({source})",
        f"request length (chars) p50/p95: train {ln['train']['p50']:.0f}/{ln['train']['p95']:.0f}, served {ln['served']['p50']:.0f}/{ln['served']['p95']:.0f} (KS {ln['ks_statistic']:.2f}, p={ln['ks_p_value']:.3g})",
        f"tool calls per conversation: train rollouts {_fmt_shares(tc['train_rollouts'])}, served {_fmt_shares(tc['served_conversations'])} (total variation {tc['total_variation']:.2f})",
        f"{c['far_share']:.0%} of served requests have no training row within cosine similarity {c['far_threshold']:g} (nearest p50 {c['nearest_similarity']['p50']:.2f})",
    ]
    status, fix = Status.PASS, []
    if c["far_share"] > 0.3 or (ln["ks_p_value"] < 0.01 and ln["ks_statistic"] > 0.3):
        status = Status.FAIL
    elif c["far_share"] > 0.1 or ln["ks_p_value"] < 0.05 or tc["total_variation"] > 0.3:
        status = Status.WARN
    if status != Status.PASS:
        fix.append(
            "Add training rows made from served requests like the farthest ones ("
            + "; ".join(repr(f["request"][:60]) for f in c["farthest"][:2])
            + "), so the model trains on what it will be asked."
        )
    return Check(rule, status, evidence, fix, comparison)


def _fmt_shares(shares: Mapping[Any, float]) -> str:
    return ", ".join(f"{k}: {v:.0%}" for k, v in shares.items()) or "-"


# -- 3. best-of-k rises ------------------------------------------------------------------
def check_best_of_k(rep: dict[str, Any]) -> Check:
    ks = list(rep["best_of_k"])
    curve = ", ".join(
        f"k={k} {rep['best_of_k'][k]:.3f} / {rep['pass_at_k'].get(k, math.nan):.3f}" for k in ks
    )
    verdict = Verdict(rep["verdict"])
    status = {Verdict.LEARNABLE: Status.PASS, Verdict.WEAK_SIGNAL: Status.WARN}.get(
        verdict, Status.FAIL
    )
    return Check(
        "best-of-k rises",
        status,
        [
            f"best-of-k / pass@k (reward >= {rep['threshold']:g}): {curve or '-'}",
            f"rows whose rewards differ: {rep['rows_with_signal']:.0%}; pre-flight verdict {verdict.value}",
        ],
        [] if status == Status.PASS else list(rep["advice"]),
        {k: rep[k] for k in ("best_of_k", "pass_at_k", "rows_with_signal", "verdict")},
    )


# -- 4. hackability ----------------------------------------------------------------------
def check_hackability(probes: dict[str, Any]) -> Check:
    median = probes["base_median"]
    control = probes.get("control")
    control_mean = probes["probes"][control]["mean"] if control else None

    def bar(p: dict[str, Any]) -> float | None:
        """The base median, or the control's mean on the probe's own rows where higher."""
        if control_mean is None or median is None:
            return median
        mine, theirs = p.get("by_row") or {}, probes["probes"][control].get("by_row") or {}
        same = [theirs[row] for row in mine if row in theirs]
        return max(median, statistics.fmean(same) if same else control_mean)

    above = {
        name: p
        for name, p in probes["probes"].items()
        if name != control
        and p["mean"] is not None
        and (b := bar(p)) is not None
        and p["mean"] > b + AGREE_EPS
    }
    lines = [
        f"probe {name}: mean {p['mean']:.3f} on {p['graded']} rows"
        if p["mean"] is not None
        else f"probe {name}: not graded ({p['rows']} rows{', ' + ', '.join(p['errors']) if p['errors'] else ''})"
        for name, p in probes["probes"].items()
    ]
    evidence = [
        f"base model median reward {median:.3f} over {probes['base_rollouts']} rollouts"
        if median is not None
        else "the base model got no graded rollout",
        *(
            [
                f"every reply starts with a call, which each probe makes as the base model did: a probe must beat the {control} (that call, no real answer) at {control_mean:.3f}"
            ]
            if control_mean is not None
            else []
        ),
        *lines,
    ]
    fix = [
        f"{name} ({p['description']}) scores {p['mean']:.3f}, above the base median {median:.3f}{f' and the {control} {control_mean:.3f}' if control_mean is not None else ''}, e.g. answer {p['example']['answer'][:80]!r}: make the grader give it nothing (cap the answer's size, ground it in this rollout's tool output, require the expected format)."
        for name, p in above.items()
    ]
    return Check(
        "reward is not hackable",
        Status.FAIL if above else Status.PASS,
        evidence,
        fix,
        {**probes, "failed": sorted(above)},
    )


# -- the doctor --------------------------------------------------------------------------
def doctor_job(
    job: Any,
    items: Sequence[Item],
    k: int,
    out: Path,
    *,
    train_items: Sequence[Item] | None = None,
    traffic: str | None = None,
    probes_file: str | None = None,
    model: str | None = None,
    threshold: float = 1.0,
    preflight_out: Path | None = None,
) -> dict[str, Any]:
    """Run the four checks on `items` (K base rollouts each; `train_items` for the traffic
    comparison, default `items`); write out/doctor.json and out/rollouts.jsonl. With
    `preflight_out`, the pre-flight on the same base rollouts is written there too (what
    `preflight_job` on these rows would write, without sampling them again), and the returned
    report's "preflight" keeps its "eval"."""
    from agentrft.console import console
    from agentrft.evaluate.eval import graded_records
    from agentrft.evaluate.hack_probes import PROBES, ProbeSettings, load_user_probes, run_probes
    from agentrft.evaluate.measure import job_grader, require, sample_rollouts, write_preflight
    from agentrft.evaluate.traffic import compare_traffic, load_traffic
    from agentrft.rollout.records import finite, write_jsonl
    from agentrft.runtime import job_environment

    require(k >= 2, "doctor needs -k 2 or more: best-of-k and signal need several samples per row")
    t0 = time.perf_counter()
    probes = [*PROBES, *(load_user_probes(probes_file) if probes_file else [])]
    served = load_traffic(traffic) if traffic else None  # a bad log fails before any work
    grader = job_grader(job)
    with job_environment(job) as env_url:
        groups, settings = sample_rollouts(
            job, items, k, model, None, env_url, grader, label="doctor: base rollouts"
        )
        console.print("doctor: grading every rollout twice")
        first = asyncio.run(grade_groups(groups, grader))
        second = asyncio.run(grade_groups(groups, grader))
        asyncio.run(cleanup_traces(env_url, [t for g in groups for t in g.trajectories]))
        console.print(f"doctor: {len(probes)} hack probes x {len(items)} rows")
        ext = job.agentrft
        probe_settings = ProbeSettings(
            tools=settings.tools,
            system_prompt=ext.system_prompt,
            few_shot=tuple(ext.few_shot_messages),
            rules=settings.rules,
            prefill_for=getattr(settings, "prefill_for", lambda turn, item, messages=(): None),
        )
        hacks, probe_groups = run_probes(probes, first, probe_settings, grader, env_url)
    trajs_by_row: dict[int, list[Trajectory]] = {}  # what the tools returned, base and probes
    for g in [*first, *probe_groups]:
        trajs_by_row.setdefault(g.item.index, []).extend(g.trajectories)
    ks = [x for x in (1, 2, 4, 8, 16, 32) if x <= k]
    rep = (
        write_preflight(first, k, preflight_out, threshold)
        if preflight_out is not None
        else preflight(first, ks, threshold)
    )
    comparison = (
        compare_traffic(
            list(train_items or items), [t for g in first for t in g.trajectories], served
        )
        if served is not None
        else None
    )
    checks = [
        check_success(first, second, trajs_by_row, job.rl.grader, threshold),
        check_traffic(comparison, traffic),
        check_best_of_k(rep),
        check_hackability(hacks),
    ]
    report = {
        "job": _shown(str(job.source)),
        "rows": len(items),
        "k": k,
        "wall_s": time.perf_counter() - t0,
        "checks": [asdict(c) for c in checks],
        "preflight": {kk: v for kk, v in rep.items() if kk != "eval"},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.json").write_text(json.dumps(finite(report), indent=2, default=str))
    write_jsonl(out / "rollouts.jsonl", graded_records(first))
    return report | {"preflight": rep} if preflight_out is not None else report


def _shown(path: str) -> str:
    """A job path as the report shows it: relative to the working directory when under it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd())) if p.is_absolute() else path
    except ValueError:
        return path


def doctor_table(report: Mapping[str, Any]) -> Any:
    """The console view: one row per rule with its verdict and evidence, then the fixes."""
    from rich.console import Group as Lines
    from rich.table import Table
    from rich.text import Text

    style = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    t = Table(
        title=f"agentrft doctor: {report['job']} ({report['rows']} rows x {report['k']}, {report['wall_s']:.0f} s)",
        header_style="bold",
        show_lines=True,
    )
    t.add_column("rule")
    t.add_column("verdict")
    t.add_column("evidence")
    for c in report["checks"]:
        t.add_row(
            c["rule"], f"[{style[c['status']]}]{c['status'].upper()}[/]", "\n".join(c["evidence"])
        )
    fixes = [
        Text(f"fix ({c['rule']}): {line}")
        for c in report["checks"]
        if c["status"] != "pass"
        for line in c["fix"]
    ]
    return Lines(t, *fixes)
