"""`agentrft demo code_fix`: the code-fix recipe end to end, on this repository's own code and
on two public Python projects (their PyPI sdists, which ship their tests).

    data -> the task as is: pre-flight -> (no signal) the easier variant: pre-flight -> (no
    signal) the repair tools: pre-flight + baseline -> train only where a pre-flight found
    signal -> trained eval -> compare

(A rung without signal is not given a held-out baseline: the next rung is measured.)

Bugs are injected into small, pure modules of this repository at PINNED_REV (read with `git
archive`, so every clone builds the same rows) and into SDISTS (pinned versions and sha256,
fetched once with `pip download` into the output folder), and kept where their own tests catch
them. Each source is split by file on its own, so held-out bugs are in files no training bug
touches. The seed's order is kept: no training on a task whose pre-flight says it cannot teach.
The task as is (the failing test only) is measured first; the easier variant (the edit call
prefilled on the buggy line) second; the repair variant (fault localization and numbered fix
candidates in the request, the first reply prefilled up to the candidate's number) third. Run
it through `agentrft demo code_fix [--steps N] [--seed S] [--out DIR]`, and over several seeds
with `--seeds 1 2 3`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrft.console import console
from agentrft.data.jsonl import write_jsonl
from agentrft.job import Job
from agentrft.tasks import runner as recipes
from agentrft.tasks.code_fix.dataset import (
    DEFAULT_TEST_COMMAND,
    BuildReport,
    build_dataset,
    hinted,
)
from agentrft.tasks.code_fix.source import Sdist, fetch_sdist
from agentrft.tools.envkit import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # the agentrft checkout
PINNED_REV = "fb285dde908efab8c8bc1ae25f97d1994d15474e"  # the code the bugs go into: every clone builds the same rows
INCLUDE = (  # small, pure modules whose unit tests run in seconds without the model
    "agentrft/graders/string_check.py",
    "agentrft/graders/file_f1.py",
    "agentrft/graders/multi.py",
    "agentrft/graders/template.py",
    "agentrft/evaluate/estimators.py",
)
MAX_PER_FILE = 6
EVAL_SAMPLES = 2  # rollouts per held-out row, before and after
PREFLIGHT_ROWS, PREFLIGHT_K = 6, 4
VARIANTS = (  # measured in order; the first whose pre-flight finds signal is trained
    recipes.Variant("task", "job.yaml", "data"),  # the failing test and its output only
    recipes.Variant("easier", "job_easy.yaml", "data-easy"),  # the edit prefilled on the line
    recipes.Variant("repair", "job_repair.yaml", "data-repair"),  # localization + candidates
)


SDISTS = (
    Sdist(
        "semver",
        "3.0.2",
        "6253adb39c70f6e51afed2fa7152bcd414c411286088fb4b9effb133885ab4cc",
        include=("src/semver/version.py", "src/semver/cli.py", "src/semver/_deprecated.py"),
        tests=("tests/test_*.py",),
        test_command=f"{DEFAULT_TEST_COMMAND} -o addopts=",  # its setup.cfg asks for pytest-cov
        all_tests_cover=True,  # its tests import the package, not its modules
    ),
    Sdist(
        "toolz",
        "1.0.0",
        "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02",
        include=("toolz/*.py",),
        exclude=("toolz/_version.py", "toolz/_signatures.py", "toolz/compatibility.py"),
        tests=("toolz/tests/test_*.py",),
        val_fraction=0.5,  # recipes.py and functoolz.py: at least 16 held-out bugs in all
    ),
)


CACHE = REPO / "runs" / ".cache" / "code_fix"  # rows built before, by what they were built from
DATA_DIRS = ("data", "data-easy", "data-repair")


def build_key() -> str:
    """What the rows are made from: the pinned sources and the code that injects the bugs,
    runs the tests, localizes and writes the requests. The same key gives the same rows."""
    h = hashlib.sha256(repr((PINNED_REV, INCLUDE, MAX_PER_FILE, SDISTS)).encode())
    for name in ("dataset.py", "repair.py", "source.py"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def build_data(data: Path) -> BuildReport:
    """`data`, `data-easy` and `data-repair` beside it, copied from the rows built before from
    the same sources and code (CACHE/KEY) or built there now (`build_into`)."""
    cached = CACHE / build_key()
    done = cached / "report.json"
    if done.is_file():
        console.print(f"reusing the rows built in {cached} (the same sources and code)")
    else:
        shutil.rmtree(cached, ignore_errors=True)
        report = build_into(cached / "data")
        # by field, not dataclasses.asdict: that rebuilds a Counter from its (key, count) pairs,
        # which counts the pairs
        fields = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
        done.write_text(json.dumps(fields))
    for name in DATA_DIRS:
        for split in ("train.jsonl", "val.jsonl"):
            (data.parent / name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached / name / split, data.parent / name / split)
    for line in fix_positions(data.parent / "data-repair"):
        console.print(line, highlight=False)
    fields = json.loads(done.read_text())
    fields["dropped"], fields["kept_kinds"] = (
        Counter(fields["dropped"]),
        Counter(fields["kept_kinds"]),
    )
    return BuildReport(**fields)


def fix_positions(folder: Path) -> list[str]:
    """Where the candidate that undoes each bug lands in the repair variant's list, per split
    (the rows' `fix_candidate`): what trying the candidates in order can reach."""
    out = []
    for split, name in (("train", "training"), ("val", "held-out")):
        rows = [json.loads(x) for x in (folder / f"{split}.jsonl").read_text().splitlines()]
        at = Counter(r.get("fix_candidate") for r in rows)
        out.append(
            f"repair candidates, {len(rows)} {name} bugs: the fix is candidate 1 for {at[1]}, "
            f"one of 1-3 for {at[1] + at[2] + at[3]}, listed for {len(rows) - at[None]}"
        )
    return out


def _workers() -> int:
    """Test runs at once while building: one per core this process may use, at most 4 (each
    run is one single-threaded pytest process; its CPU-time limit does not depend on this)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def build_into(data: Path) -> BuildReport:
    """The rows once per source (the bugs and their test runs), merged into `data` (the task
    as is), then the other variants' prompts of the same bugs (data-easy, data-repair beside
    it). Each source is split by file on its own; the rows point at the sources' snapshots
    beside them (sources/NAME). Sources are built side by side, and the bugs localized side
    by side (`_workers`); the rows and their order do not depend on it."""
    parts = data.parent / "sources"

    def log(name: str) -> Any:
        return lambda line: console.print(f"  {name}: {line}", highlight=False, markup=False)

    def own() -> BuildReport:
        return build_dataset(
            REPO,
            parts / "agentrft",
            rev=PINNED_REV,
            include=INCLUDE,
            max_per_file=MAX_PER_FILE,
            log=log("agentrft"),
        )

    def public(sdist: Sdist) -> BuildReport:
        return build_dataset(
            fetch_sdist(sdist, data.parent / "sdists"),
            parts / sdist.name,
            include=sdist.include,
            exclude=sdist.exclude,
            tests=sdist.tests,
            test_command=sdist.test_command,
            max_per_file=MAX_PER_FILE,
            all_tests_cover=sdist.all_tests_cover,
            val_fraction=sdist.val_fraction,
            log=log(sdist.name),
        )

    names = ["agentrft", *(s.name for s in SDISTS)]
    console.print(f"injecting bugs into {', '.join(names)}, {_workers()} test runs at once")
    with ThreadPoolExecutor(_workers()) as pool:
        jobs = [pool.submit(own), *(pool.submit(public, s) for s in SDISTS)]
        builds = list(zip(names, (j.result() for j in jobs), strict=True))
    merged = BuildReport(commit=", ".join(f"{n} {r.commit[:12]}" for n, r in builds))
    for name, part in builds:
        merged.train += part.train
        merged.val += part.val
        merged.dropped.update(part.dropped)
        merged.kept_kinds.update(part.kept_kinds)
        merged.files.update({f"{name}: {path}": info for path, info in part.files.items()})
    for split in ("train", "val"):
        rows = [
            json.loads(x)
            for name, _ in builds
            for x in (parts / name / f"{split}.jsonl").read_text().splitlines()
        ]
        write_jsonl(data / f"{split}.jsonl", rows)
        write_jsonl(data.parent / "data-easy" / f"{split}.jsonl", (hinted(r, "line") for r in rows))
        console.print(f"localizing the {len(rows)} {split} bugs for the repair variant")
        with ThreadPoolExecutor(_workers()) as pool:
            repair_rows = list(pool.map(lambda r: hinted(r, "repair"), rows))
        write_jsonl(data.parent / "data-repair" / f"{split}.jsonl", repair_rows)
    return merged


def variant_job(
    folder: Path, data: Path, out: Path, steps: int | None, seed: int | None, job_path: Path | None
) -> Job:
    """The variant's job (runner.demo_job) with its environment and graders on a free port
    (so demos can run side by side)."""
    job = recipes.demo_job(folder, data, out, steps, seed, job_path)
    port = free_port()
    grader = json.loads(json.dumps(job.rl.grader).replace("127.0.0.1:8741", f"127.0.0.1:{port}"))
    assert job.agentrft.environment is not None
    env = job.agentrft.environment.model_copy(update={"port": port})
    rl = job.rl.model_copy(update={"grader": grader})
    method = job.method.model_copy(update={"reinforcement": rl})
    return job.model_copy(
        update={"method": method, "agentrft": job.agentrft.model_copy(update={"environment": env})}
    )


def sub_score(record: dict[str, Any], name: str) -> float | None:
    """One sub-grader's score of a graded rollout (0 for a gated-off style or bonus); None
    when it was discarded or its grade failed."""
    grade = record.get("grade") or {}
    if record.get("discarded") or grade.get("error"):
        return None
    subs = grade.get("sub_scores") or {}
    return float(subs.get(name, 0.0))


def tests_by_row(records: list[dict[str, Any]]) -> dict[Any, float]:
    """The share of each row's rollouts that passed the tests (the gate)."""
    rows: dict[Any, list[float]] = {}
    for rec in records:
        if (v := sub_score(rec, "tests")) is not None:
            rows.setdefault(rec.get("row"), []).append(v)
    return {row: sum(v) / len(v) for row, v in rows.items()}


def headline(res: dict[str, Any], records: list[dict[str, Any]], job: Job) -> dict[str, float]:
    kept = [r for r in records if not r.get("discarded")]

    def mean(name: str) -> float:
        vals = [v for r in kept if (v := sub_score(r, name)) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    edited = [
        r
        for r in kept
        if any(
            c.get("name") == "edit" for t in r.get("turns") or [] for c in t.get("tool_calls") or []
        )
    ]
    return {
        "reward": res["reward"]["mean"],
        "tests pass (gate)": mean("tests"),
        "style (when passed)": mean("style"),
        "validated bonus": mean("validated"),
        "share that called edit": len(edited) / max(1, len(kept)),
        "tool calls p50": res["tool_calls"]["p50"],
        "tool calls p95": res["tool_calls"]["p95"],
        "tool calls max": res["tool_calls"]["max"],
        "tokens to tools": res["tool_call_tokens"]["mean"],
        "sampled tokens per rollout": res["sampled_tokens"]["mean"],
        "invalid tool calls": float(res["invalid_tool_calls"]),
    }


RECIPE = recipes.Recipe(
    title="code fix",
    folder=HERE,
    build_data=build_data,
    too_few_rows=f"{REPO}: too few bugs kept for the demo",
    metric="tests pass (gate)",
    row_scores=tests_by_row,
    headline=headline,
    expected=lambda record: f"the tests of {', '.join(record['item'].get('files', []))} pass",
    rows="bugs",
    eval_samples=EVAL_SAMPLES,
    preflight_rows=PREFLIGHT_ROWS,
    preflight_k=PREFLIGHT_K,
    seed_columns=("tool calls p50", "tool calls p95", "tool calls max", "tokens to tools"),
    variants=VARIANTS,
    variant_job=variant_job,
)
