"""The recipes (`agentrft/tasks/NAME/`, one folder per use case) that `agentrft demo NAME` runs: how
they are found, and the one runner they share.

A recipe is a folder of the agentrft checkout holding a `demo.py` with the same small
interface:

    run(out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None) -> dict
        the use case end to end: data, doctor, pre-flight, baseline, train, compare, report;
        returns the summary it also writes to out/summary.json (`doctor_only=True`: data and
        the doctor only)
    run_seeds(out: Path, seeds: list[int], steps=None, job_path=None) -> dict   (optional)
        `run` once per seed, and the gain over all of them with a 95% interval

beside its environment, job and README. Recipes are found on disk, not registered: a new
folder with a demo.py is a new recipe. Most recipes only describe themselves, as
`RECIPE = Recipe(...)` (its data, its measure, its headline numbers); `load` then gives them
the shared `run` and `run_seeds` below, which walk the user's path the same way for all:
data -> doctor -> pre-flight -> baseline -> train -> evaluation of the trained model -> compare +
report.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrft.console import console, show_messages, summary_table
from agentrft.data import load_dataset
from agentrft.errors import ConfigError
from agentrft.evaluate.doctor import doctor_job, doctor_table
from agentrft.evaluate.estimators import paired_difference
from agentrft.evaluate.measure import evaluate_model, preflight_job, print_compare, print_preflight
from agentrft.evaluate.preflight import Verdict
from agentrft.evaluate.report import write_report
from agentrft.job import Job, load_job
from agentrft.rollout.records import read_jsonl
from agentrft.train.loop import train
from agentrft.train.observe import read_metrics

RECIPES = Path(__file__).resolve().parent
DEFAULT = "file_selection"


def available(root: Path = RECIPES) -> list[str]:
    """The recipe names under `root`, sorted."""
    return sorted(p.parent.name for p in root.glob("*/demo.py"))


def load(name: str = DEFAULT, root: Path = RECIPES) -> ModuleType:
    """The recipe's demo module; ConfigError naming the recipes there are when `name` is not one."""
    script = root / name / "demo.py"
    if not script.is_file():
        names = available(root)
        if not names:
            raise ConfigError(
                f"no recipes under {root}: `agentrft demo` runs from a checkout of the agentrft repository"
            )
        raise ConfigError(f"no recipe {name!r} -> one of: {', '.join(names)}")
    spec = importlib.util.spec_from_file_location(f"agentrft_recipe_{name}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipe = getattr(module, "RECIPE", None)
    if isinstance(recipe, Recipe):  # the shared runner, unless the recipe brings its own
        module.__dict__.setdefault("run", functools.partial(run, recipe))
        module.__dict__.setdefault("run_seeds", functools.partial(run_seeds, recipe))
    if not callable(getattr(module, "run", None)):
        raise ConfigError(
            f"{script}: a recipe's demo.py defines RECIPE = agentrft.tasks.runner.Recipe(...), or run(out, steps=None, seed=None, job_path=None)"
        )
    return module


# -- the runner every recipe's demo.py calls -------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One job of a recipe and the data folder it reads. A recipe's variants are measured in
    order (pre-flight, then the baseline: skipped for a trainable one without signal that has
    another after it); the first trainable one whose pre-flight finds signal
    is trained and compared, and after it only the measure-only ones (`train=False`) run."""

    name: str = "task"
    job: str = "job.yaml"  # in the recipe's folder
    data: str = "data"  # the folder under the demo's output that build_data writes for it
    train: bool = True  # False: baseline and pre-flight only, never trained


@dataclass(frozen=True)
class Recipe:
    """What differs between recipes; `run` and `run_seeds` below do the rest, the same way
    for all of them: data -> pre-flight -> baseline -> train -> trained eval -> compare."""

    title: str  # "file selection": the report's title
    folder: Path  # agentrft/tasks/NAME: job.yaml and env.py
    build_data: Callable[[Path], Any]  # writes DIR/train.jsonl, DIR/val.jsonl; returns a report
    metric: str  # the headline key that is the recipe's measure, e.g. "mean file F1"
    row_scores: Callable[[list[dict[str, Any]]], dict[Any, float]]  # that measure per row
    headline: Callable[[dict[str, Any], list[dict[str, Any]], Job], dict[str, float]]
    expected: Callable[[dict[str, Any]], str]  # a row's right answer, said of the shown rollout
    too_few_rows: str = "too few rows for the demo"  # and what to do about it
    rows: str = "rows"  # what the held-out set is made of, for the printed lines
    select_val: Callable[[list[Any]], list[Any]] = list  # the held-out rows evaluated
    eval_samples: int = 2  # rollouts per held-out row, before and after
    preflight_rows: int = 6
    preflight_k: int = 8
    doctor_k: int = 4  # base rollouts per row the doctor samples (on the pre-flight's rows)
    # the training rows the pre-flight samples, given them all and preflight_rows (default: the first)
    select_preflight: Callable[[list[Any], int], list[Any]] = lambda items, n: items[:n]
    seed_columns: tuple[str, ...] = ()  # headline keys shown per seed beside the measure
    # the jobs measured in order (one, unless the recipe has easier variants to fall back on);
    # build_data writes the first one's data folder and returns the report of the rows
    variants: tuple[Variant, ...] = (Variant(),)
    # the variant's job, reading `data` and writing under `out` (default: demo_job below)
    variant_job: Callable[..., Job] | None = None


def demo_job(
    folder: Path, data: Path, out: Path, steps: int | None, seed: int | None, job_path: Path | None
) -> Job:
    """The recipe's job (or a variant of it), reading the demo's data and writing under
    `out`; paths in it still resolve against the job file's folder."""
    job = load_job(job_path or folder / "job.yaml")
    train_cfg = (
        job.agentrft.train
        if steps is None
        else job.agentrft.train.model_copy(
            update={"max_steps": steps, "checkpoint_interval": steps}
        )
    )
    update: dict[str, Any] = {
        "training_file": str(data / "train.jsonl"),
        "validation_file": None,  # evaluated before and after, outside the loop
        "agentrft": job.agentrft.model_copy(update={"train": train_cfg, "output_dir": str(out)}),
    }
    if seed is not None:
        update["seed"] = seed
    return job.model_copy(update=update)


def calls_per_turn(records: list[dict[str, Any]]) -> float:
    """Tool calls per turn that made any (parallel calls in one reply count together)."""
    counts = [len(t.get("tool_calls") or []) for r in records for t in r.get("turns") or []]
    with_calls = [c for c in counts if c]
    return sum(with_calls) / len(with_calls) if with_calls else 0.0


def per_row(
    recipe: Recipe, before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> dict[str, Any]:
    """The recipe's measure per held-out row, before and after, and the paired difference."""
    a, b = recipe.row_scores(before), recipe.row_scores(after)
    rows = sorted(set(a) & set(b))
    diff = paired_difference([b[r] - a[r] for r in rows])
    return {
        "rows": {str(r): {"before": a[r], "after": b[r]} for r in rows},
        "difference": {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": diff.n},
    }


def show_best_rollout(recipe: Recipe, records: list[dict[str, Any]], label: str) -> None:
    """The highest-rewarded rollout that called a tool: the row's request onwards (the system
    prompt and the worked examples are left out)."""
    with_calls = [r for r in records if r.get("num_tool_calls") and r.get("reward") is not None]
    if not with_calls:
        console.print(f"({label}: no rollout called a tool)")
        return
    best = max(with_calls, key=lambda r: r["reward"])
    messages = best["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    show_messages(
        messages[start:],
        f"{label}: best rollout with a tool call  reward={best['reward']:.3f}  expected: {recipe.expected(best)}",
        max_chars=600,
    )


@dataclass
class Measured:
    """One variant's job, rows and baseline, and what its pre-flight said."""

    job: Job
    train_items: list[Any]
    val_items: list[Any]
    out: Path
    before: dict[str, Any] | None  # None: not sampled (measure's `moves_on`)
    preflight: dict[str, Any]
    doctor: dict[str, Any]


def run_doctor(
    recipe: Recipe,
    job: Job,
    train_items: list[Any],
    out: Path,
    label: str,
    preflight_out: Path | None = None,
) -> dict[str, Any]:
    """The doctor's four checks on the pre-flight's training rows; prints its table. With
    `preflight_out`, its base rollouts are the pre-flight's too (doctor_job)."""
    rows = recipe.select_preflight(train_items, recipe.preflight_rows)
    console.rule(f"{label}doctor: {len(rows)} training {recipe.rows} x {recipe.doctor_k}")
    rep = doctor_job(
        job,
        rows,
        recipe.doctor_k,
        out / "doctor",
        train_items=train_items,
        preflight_out=preflight_out,
    )
    console.print(doctor_table(rep))
    return rep


def measure(
    recipe: Recipe, job: Job, data: Path, out: Path, label: str, moves_on: bool = False
) -> Measured:
    """The doctor, the pre-flight on training rows, then the baseline on the held-out rows,
    for one variant. The doctor samples the pre-flight's rows; when it samples as many per row
    (doctor_k == preflight_k), the pre-flight is read from those rollouts, not sampled again.
    `moves_on`: an easier variant is measured next when this one's pre-flight finds no
    signal, so then its baseline is not sampled (`before` is None): it would only say again,
    at more cost, that the base model cannot do the task."""
    train_items = load_dataset(data / "train.jsonl")
    val_items = recipe.select_val(load_dataset(data / "val.jsonl"))
    n, k, rows = recipe.eval_samples, recipe.preflight_k, recipe.preflight_rows
    shared = recipe.doctor_k == k
    doctor = run_doctor(recipe, job, train_items, out, label, out / "preflight" if shared else None)
    if shared:
        console.rule(f"{label}pre-flight: the doctor's {rows} training {recipe.rows} x {k}")
        rep = doctor["preflight"]
    else:
        console.rule(f"{label}pre-flight: {rows} training {recipe.rows} x {k}")
        rep = preflight_job(job, recipe.select_preflight(train_items, rows), k, out / "preflight")
    print_preflight(rep)
    before = None
    if moves_on and not Verdict(rep["verdict"]).worth_training:
        console.print(
            f"{label}baseline on the held-out {recipe.rows} skipped: the pre-flight found no "
            "signal, so the next variant is measured (measure this one alone with --variant)"
        )
    else:
        console.rule(
            f"{label}baseline: the base model on {len(val_items)} held-out {recipe.rows} x {n}"
        )
        before = evaluate_model(job, val_items, n, "base", out / "baseline", label="baseline")
        console.print(summary_table(before, title=f"{label}baseline"))
    return Measured(job, train_items, val_items, out, before, rep, doctor)


def train_and_compare(recipe: Recipe, m: Measured, label: str) -> dict[str, Any]:
    """Train the variant, evaluate the trained model on the same held-out rows, compare, and
    write the report; returns the summary's before/after/steps/per_row."""
    out, job = m.out, m.job
    assert m.before is not None  # a variant with signal has its baseline
    console.rule(f"{label}train (the pre-flight found signal)")
    run_dir = train(job, out / "run")
    console.rule(f"{label}the trained model on the same held-out {recipe.rows}")
    after = evaluate_model(
        job, m.val_items, recipe.eval_samples, str(run_dir), out / "trained", label="trained"
    )
    console.print(summary_table(after, title=f"{label}trained"))
    console.rule(f"{label}compare")
    print_compare(m.before, after, "base", "trained")
    base_records = read_jsonl(out / "baseline/rollouts.jsonl")
    trained_records = read_jsonl(out / "trained/rollouts.jsonl")
    a, b = (
        recipe.headline(m.before, base_records, job),
        recipe.headline(after, trained_records, job),
    )
    paired = per_row(recipe, base_records, trained_records)
    page = write_report(
        out / "report.html",
        metrics=read_metrics(run_dir),
        before={"summary": m.before, "rollouts": base_records},
        after={"summary": after, "rollouts": trained_records},
        rollouts=trained_records,
        title=f"agentrft demo: {recipe.title}",
        doctor=m.doctor,
        run_dir=run_dir,
    )
    show_best_rollout(recipe, trained_records, f"trained model, held-out {recipe.rows[:-1]}")
    width = max(map(len, a)) + 2
    console.print(f"\n{'held-out ' + recipe.rows:<{width}}{'base':>10}{'trained':>10}")
    for key in a:
        console.print(f"{key:<{width}}{a[key]:>10.3f}{b[key]:>10.3f}")
    d = paired["difference"]
    console.print(
        f"\n{recipe.metric}, trained - base, per held-out {recipe.rows[:-1]}: {d['mean']:+.3f} (95% interval {d['low']:+.3f} .. {d['high']:+.3f}, {d['n']} {recipe.rows})"
    )
    console.print(f"report: {page}")
    return {"before": a, "after": b, "steps": len(read_metrics(run_dir)), "per_row": paired}


def run(
    recipe: Recipe,
    out: Path,
    steps: int | None = None,
    seed: int | None = None,
    job_path: Path | None = None,
    doctor_only: bool = False,
    only: str | None = None,
) -> dict[str, Any]:
    """The recipe end to end in `out`; returns the summary it also writes to out/summary.json.
    `job_path` replaces the first variant's job. A recipe with one variant writes its stages
    straight into `out`; with several, each into out/NAME. `doctor_only`: build the data and
    run the doctor on every variant's job, nothing else. `only`: the one variant measured
    (and trained when its pre-flight finds signal); the others are skipped."""
    t0 = time.perf_counter()
    names = [v.name for v in recipe.variants]
    if only is not None and only not in names:
        raise ConfigError(
            f"recipe {recipe.title!r} has no variant {only!r} -> one of: {', '.join(names)}"
        )
    out = out.resolve()  # the job resolves relative paths against its own folder, not the caller's
    out.mkdir(parents=True, exist_ok=True)

    console.rule(f"data: {recipe.title}")
    report = recipe.build_data(out / recipe.variants[0].data)
    for line in report.lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if report.train < recipe.preflight_rows or report.val < 2:
        raise ConfigError(
            f"{recipe.too_few_rows} ({report.train} train / {report.val} validation rows)"
        )
    several = len(recipe.variants) > 1
    make_job = recipe.variant_job or demo_job
    summary: dict[str, Any] = {"metric": recipe.metric, "variants": {}, "trained": None}
    lead: Measured | None = None  # the trained variant, else the first: the summary's job and rows
    for i, variant in enumerate(recipe.variants):
        if only is not None and variant.name != only:
            continue
        if summary["trained"] is not None and variant.train:
            continue  # one variant is trained; only the measure-only ones are still measured
        label = f"{variant.name}: " if several else ""
        vout = out / variant.name if several else out
        job_file = job_path.resolve() if job_path and i == 0 else recipe.folder / variant.job
        job = make_job(recipe.folder, out / variant.data, vout, steps, seed, job_file)
        if doctor_only:
            rep = run_doctor(
                recipe, job, load_dataset(out / variant.data / "train.jsonl"), vout, label
            )
            summary["variants"][variant.name] = {"job": str(job.source), "doctor": _verdicts(rep)}
            continue
        # a trainable variant with another after it: when it finds no signal, the next is measured
        moves_on = variant.train and only is None and i < len(recipe.variants) - 1
        m = measure(recipe, job, out / variant.data, vout, label, moves_on)
        verdict = Verdict(m.preflight["verdict"])
        summary["variants"][variant.name] = {
            "job": str(job.source),
            "baseline": None
            if m.before is None
            else recipe.headline(m.before, read_jsonl(vout / "baseline/rollouts.jsonl"), job),
            "preflight": {k: m.preflight[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
            "preflight_rollouts": recipe.headline(
                m.preflight["eval"], read_jsonl(vout / "preflight/rollouts.jsonl"), job
            ),
            "signal": verdict.worth_training,
            "doctor": _verdicts(m.doctor),
        }
        lead = lead or m
        if not variant.train:
            continue
        if not verdict.worth_training:  # fix the task before training on it
            console.print(
                f"[bold red]{label}pre-flight verdict {verdict.value!r}[/]: training would learn nothing, so it is skipped; see {vout / 'preflight'} and the advice above"
            )
            continue
        summary |= train_and_compare(recipe, m, label) | {"trained": variant.name}
        lead = m
    if doctor_only:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary
    assert lead is not None
    summary |= {
        "job": str(lead.job.source),
        "seed": lead.job.seed,
        "preflight": {k: lead.preflight[k] for k in ("verdict", "rows_with_signal", "best_of_k")},
        "rows": {"train": len(lead.train_items), "val": len(lead.val_items)},
    }
    if summary["trained"] is None:
        summary["verdict"] = "no variant's pre-flight found signal: nothing trained"
        console.print(f"[bold]{summary['verdict']}[/]")
    summary["wall_s"] = wall_s = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(f"\nall outputs: {out}   ({wall_s / 60:.1f} min)")
    return summary


def _verdicts(doctor: dict[str, Any]) -> dict[str, str]:
    return {c["rule"]: c["status"] for c in doctor["checks"]}


def run_seeds(
    recipe: Recipe,
    out: Path,
    seeds: list[int],
    steps: int | None = None,
    job_path: Path | None = None,
    only: str | None = None,
) -> dict[str, Any]:
    """`run` once per seed (out/seed-N), then each seed's before/after and the mean gain in
    the recipe's measure with a 95% interval over all per-row differences. A seed whose
    folder already holds a finished run is not run again, so seeds can run side by side
    (`agentrft demo NAME --seed N --out DIR/seed-N`) and be summed up here."""
    per_seed: dict[int, dict[str, Any]] = {}
    for i, seed in enumerate(seeds):
        done = out / f"seed-{seed}" / "summary.json"
        if done.is_file() and "wall_s" in (finished := json.loads(done.read_text())):
            per_seed[seed] = finished
            console.print(
                f"seed {seed}: reusing the finished run in {done.parent} (delete it to run this seed again)"
            )
            continue
        console.rule(f"[bold]seed {seed} ({i + 1} of {len(seeds)})")
        per_seed[seed] = run(
            recipe, out / f"seed-{seed}", steps=steps, seed=seed, job_path=job_path, only=only
        )
    result: dict[str, Any] = {
        "metric": recipe.metric,
        "seeds": {str(k): v for k, v in per_seed.items()},
    }
    trained = {seed: s for seed, s in per_seed.items() if s.get("trained") is not None}
    out.mkdir(parents=True, exist_ok=True)
    if not trained:
        result["verdict"] = "no variant's pre-flight found signal on any seed: nothing trained"
        console.print(result["verdict"])
        (out / "seeds.json").write_text(json.dumps(result, indent=2, default=str))
        return result
    diffs = [
        r["after"] - r["before"] for s in trained.values() for r in s["per_row"]["rows"].values()
    ]
    pooled = paired_difference(diffs)
    console.rule(f"all seeds: {recipe.metric} on the held-out {recipe.rows}")
    extra = "".join(f"{c + ' base':>22}{'trained':>9}" for c in recipe.seed_columns)
    console.print(f"{'seed':>6}{'base':>10}{'trained':>10}{'gain':>10}   95% interval{extra}")
    for seed, s in per_seed.items():
        if seed not in trained:
            console.print(f"{seed:>6}   not trained: {s.get('verdict')}")
            continue
        d = s["per_row"]["difference"]
        x, y = s["before"][recipe.metric], s["after"][recipe.metric]
        cols = "".join(f"{s['before'][c]:>22.2f}{s['after'][c]:>9.2f}" for c in recipe.seed_columns)
        console.print(
            f"{seed:>6}{x:>10.3f}{y:>10.3f}{y - x:>+10.3f}   {d['low']:+.3f} .. {d['high']:+.3f}{cols}"
        )
    mean_a = sum(s["before"][recipe.metric] for s in trained.values()) / len(trained)
    mean_b = sum(s["after"][recipe.metric] for s in trained.values()) / len(trained)
    console.print(
        f"{'mean':>6}{mean_a:>10.3f}{mean_b:>10.3f}{mean_b - mean_a:>+10.3f}   {pooled.low:+.3f} .. {pooled.high:+.3f}  ({pooled.n} {recipe.rows[:-1]} differences)"
    )
    result |= {
        "before": mean_a,
        "after": mean_b,
        "gain": {"mean": pooled.mean, "low": pooled.low, "high": pooled.high, "n": pooled.n},
    }
    (out / "seeds.json").write_text(json.dumps(result, indent=2, default=str))
    console.print(f"wrote {out / 'seeds.json'}")
    return result
