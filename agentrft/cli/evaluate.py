"""`agentrft eval | preflight | compare | sample | report`: what a user does with a model
around training (baseline, learnability check, before/after, best-of-N, the HTML page).
The work is in agentrft.evaluate.measure; this module parses arguments and prints."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agentrft.cli.engine import add_engine_flag
from agentrft.evaluate.measure import (
    evaluate_model,
    load_result,
    preflight_job,
    print_compare,
    print_preflight,
    require,
    run_graded,
)


def _items(job: Any, data: str | None, rows: int | None, split: str) -> list[Any]:
    """The rows to run: --data FILE, else the job's validation (or training) file. Both of
    the job's files are validated first, so a bad line fails before any work."""
    from agentrft.data import load_dataset

    train = load_dataset(job.training_path)
    val = load_dataset(job.validation_path) if job.validation_path else None
    if data:
        items = load_dataset(data)
    elif split == "validation":
        items = val if val is not None else train
    else:
        items = train
    return items[:rows] if rows else items


def cmd_eval(args: argparse.Namespace) -> int:
    from agentrft.console import console, summary_table
    from agentrft.job import load_job
    from agentrft.rollout.records import new_output_dir

    job = load_job(args.job)
    items = _items(job, args.data, args.rows, "validation")
    out = new_output_dir(args.out, "eval", job.agentrft.output_dir)
    model = args.model or "base"
    console.print(
        f"[bold]agentrft eval[/] {args.job}: {len(items)} rows x {args.k} samples, model {model}"
    )
    res = evaluate_model(
        job,
        items,
        args.k,
        model,
        out,
        temperature=args.temperature,
        threshold=args.threshold,
        endpoint_model=args.endpoint_model,
    )
    console.print(summary_table(res, title=f"eval: {model}"))
    console.print(f"wrote {out / 'results.json'} and rollouts.jsonl")
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.job import load_job
    from agentrft.rollout.records import new_output_dir

    job = load_job(args.job)
    items = _items(job, args.data, args.rows, args.split)
    out = new_output_dir(args.out, "preflight", job.agentrft.output_dir)
    console.print(f"[bold]agentrft preflight[/] {args.job}: {len(items)} rows x {args.k} samples")
    rep = preflight_job(
        job,
        items,
        args.k,
        out,
        model=args.model,
        temperature=args.temperature,
        threshold=args.threshold,
    )
    print_preflight(rep)
    console.print(f"wrote {out / 'preflight.json'}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.data import load_dataset
    from agentrft.evaluate.doctor import doctor_job, doctor_table
    from agentrft.evaluate.report import write_report
    from agentrft.job import load_job
    from agentrft.rollout.records import new_output_dir

    job = load_job(args.job)
    items = _items(job, args.data, args.rows, args.split)
    out = new_output_dir(args.out, "doctor", job.agentrft.output_dir)
    console.print(
        f"[bold]agentrft doctor[/] {args.job}: {len(items)} rows x {args.k} base rollouts, the job's tools and grader"
    )
    rep = doctor_job(
        job,
        items,
        args.k,
        out,
        train_items=load_dataset(job.training_path),
        traffic=args.traffic,
        probes_file=args.probes,
        model=args.model,
        threshold=args.threshold,
    )
    console.print(doctor_table(rep))
    page = write_report(out / "doctor.html", doctor=rep, title=f"agentrft doctor: {args.job}")
    console.print(f"wrote {out / 'doctor.json'} and {page}")
    return 1 if args.strict and any(c["status"] == "fail" for c in rep["checks"]) else 0


def cmd_compare(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.evaluate.report import write_report

    a, b = load_result(args.a), load_result(args.b)
    print_compare(a["summary"], b["summary"], args.a, args.b)
    out = Path(args.out) if args.out else Path("compare.html")
    write_report(
        out,
        before=a,
        after=b,
        rollouts=b["rollouts"] or a["rollouts"],
        title=f"agentrft compare: {args.a} vs {args.b}",
    )
    console.print(f"wrote {out} (plots: tool calls before/after, best-of-k)")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.evaluate.eval import graded_records
    from agentrft.graders import reward_of, sample_from_trajectory
    from agentrft.job import load_job
    from agentrft.rollout.records import new_output_dir, write_jsonl

    job = load_job(args.job)
    items = _items(job, args.data, args.rows, "validation")
    out = new_output_dir(args.out, "sample", job.agentrft.output_dir)
    console.print(
        f"[bold]agentrft sample[/] {args.job}: best of {args.best_of} per row, {len(items)} rows"
    )
    groups = run_graded(job, items, args.best_of, args.model, args.temperature, label="samples")
    best, firsts, bests = [], [], []
    for g in groups:
        scored = [(reward_of(gr), i) for i, gr in enumerate(g.grades)]
        scored = [(r, i) for r, i in scored if r == r]  # NaN: discarded or grader error
        if not scored:
            best.append(
                {
                    "row": g.item.index,
                    "reward": None,
                    "output_text": None,
                    "note": "no rollout of this row could be graded",
                }
            )
            continue
        r, i = max(scored)
        traj = g.trajectories[i]
        firsts.append(scored[0][0])
        bests.append(r)
        best.append(
            {
                "row": g.item.index,
                "reward": r,
                "of": len(scored),
                "output_text": sample_from_trajectory(traj)["output_text"],
                "trace_id": traj.trace_id,
                "item": dict(g.item.fields),
            }
        )
    write_jsonl(out / "best.jsonl", best)
    write_jsonl(out / "rollouts.jsonl", graded_records(groups))
    if bests:
        console.print(
            f"mean reward: best-of-{args.best_of} {sum(bests) / len(bests):.3f}  vs  a single sample {sum(firsts) / len(firsts):.3f}  ({len(bests)} rows)"
        )
    console.print(f"wrote {out / 'best.jsonl'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.evaluate.report import write_report
    from agentrft.rollout.records import read_jsonl
    from agentrft.train.observe import read_metrics

    run = Path(args.run_dir)
    require(run.is_dir(), f"{run}: not a directory")
    metrics = read_metrics(run)
    evals = sorted(
        run.glob("rollouts/eval-step-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
    )
    before = {"rollouts": read_jsonl(evals[0])} if evals else None
    after = {"rollouts": read_jsonl(evals[-1])} if len(evals) > 1 else None
    if before is None and (run / "results.json").is_file():  # an eval directory
        before = load_result(str(run))
    rollouts = (after or before or {}).get("rollouts") or []
    if not rollouts:
        steps = sorted(
            run.glob("rollouts/step-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
        )
        rollouts = read_jsonl(steps[-1]) if steps else []
    out = Path(args.out) if args.out else run / "report.html"
    write_report(
        out,
        metrics=metrics,
        before=before,
        after=after,
        rollouts=rollouts,
        title=f"agentrft report: {run.name}",
        run_dir=run,
    )
    console.print(f"wrote {out}")
    return 0


def add_commands(sub: Any) -> None:
    e = sub.add_parser(
        "eval", help="baseline or evaluate a model: reward, tool calls, tokens, latency"
    )
    e.add_argument("job")
    e.add_argument(
        "--model",
        default=None,
        help="base (default) | RUN_DIR | model path | http(s) URL of an OpenAI-compatible endpoint",
    )
    e.add_argument("--data", default=None, help="a JSONL file (default: the job's validation file)")
    e.add_argument("-k", type=int, default=1, help="samples per row (default 1)")
    e.add_argument("--rows", type=int, default=None, help="only the first N rows")
    e.add_argument(
        "--threshold", type=float, default=1.0, help="reward counted as a pass (default 1.0)"
    )
    e.add_argument(
        "--temperature", type=float, default=None, help="default: the job's sampling temperature"
    )
    e.add_argument(
        "--endpoint-model",
        default=None,
        help="with a URL: the model name to request (default: the first the endpoint lists)",
    )
    e.add_argument("--out", default=None, help="output directory (default runs/eval-TIMESTAMP)")
    add_engine_flag(e)
    e.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "preflight", help="can the task teach anything? signal share, best-of-k, pass@k, a verdict"
    )
    p.add_argument("job")
    p.add_argument("-k", type=int, default=8, help="samples per row (default 8)")
    p.add_argument("--split", choices=["train", "validation"], default="train")
    p.add_argument("--data", default=None)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument(
        "--model", default=None, help="base (default) | RUN_DIR | model path | endpoint URL"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=1.0,
        help="reward counted as a pass for pass@k (default 1.0)",
    )
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--out", default=None)
    add_engine_flag(p)
    p.set_defaults(func=cmd_preflight)

    d = sub.add_parser(
        "doctor",
        help="before training: is success unambiguous, does the data mirror traffic, does best-of-k rise, can the reward be hacked",
    )
    d.add_argument("job")
    d.add_argument("-k", type=int, default=4, help="base rollouts per row (default 4)")
    d.add_argument("--rows", type=int, default=6, help="rows checked (default the first 6)")
    d.add_argument("--split", choices=["train", "validation"], default="train")
    d.add_argument("--data", default=None, help="a JSONL file of rows to check instead")
    d.add_argument(
        "--traffic",
        default=None,
        metavar="LOG",
        help="served requests (a `serve-model --request-log` JSONL file or a folder of them) to compare the training rows with",
    )
    d.add_argument(
        "--probes",
        default=None,
        metavar="JSONL",
        help='your own hack probes, one per line: {"name", "answer", "tool_call": "base" | {"name", "arguments"} | null}',
    )
    d.add_argument("--model", default=None, help="base (default) | RUN_DIR | model path")
    d.add_argument(
        "--threshold", type=float, default=1.0, help="reward counted as solved (default 1.0)"
    )
    d.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    d.add_argument("--out", default=None, help="output directory (default runs/doctor-TIMESTAMP)")
    d.set_defaults(func=cmd_doctor)

    c = sub.add_parser("compare", help="two eval results side by side (table + HTML plots)")
    c.add_argument("a", help="eval directory (or results.json): the baseline")
    c.add_argument("b", help="eval directory (or results.json): the candidate")
    c.add_argument("--out", default=None, help="HTML file with the plots (default compare.html)")
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser("sample", help="best-of-N: per row, the highest-graded of N rollouts")
    s.add_argument("job")
    s.add_argument("--best-of", type=int, required=True, metavar="N")
    s.add_argument(
        "--model", default=None, help="base (default) | RUN_DIR | model path | endpoint URL"
    )
    s.add_argument("--data", default=None)
    s.add_argument("--rows", type=int, default=None)
    s.add_argument("--temperature", type=float, default=None)
    s.add_argument("--out", default=None)
    add_engine_flag(s)
    s.set_defaults(func=cmd_sample)

    rp = sub.add_parser(
        "report", help="one self-contained HTML page for a training run or eval directory"
    )
    rp.add_argument("run_dir")
    rp.add_argument("--out", default=None, help="default RUN_DIR/report.html")
    rp.set_defaults(func=cmd_report)
