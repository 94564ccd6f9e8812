"""The `agentrft` command line: each subcommand is one step of the user's path. The parser,
the top-level commands (rollout, train, demo, serve-model) and `main`; the other modules of
agentrft/cli/ add their families of subcommands."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from agentrft.cli.data import add_commands as add_data_commands
from agentrft.cli.engine import add_engine_flag, apply_engine_flag
from agentrft.cli.evaluate import add_commands as add_evaluate_commands
from agentrft.cli.graders import add_commands as add_grader_commands
from agentrft.cli.service import add_commands as add_service_commands
from agentrft.errors import AgentRFTError, ConfigError


def cmd_rollout(args: argparse.Namespace) -> int:
    from agentrft.console import (
        console,
        progress_bar,
        show_precision,
        show_trajectory,
        summary_table,
    )
    from agentrft.data import load_dataset
    from agentrft.job import load_job
    from agentrft.policy.hf import HFPolicy
    from agentrft.rollout.group import rollout_groups
    from agentrft.rollout.records import new_output_dir, summarize, to_record, write_jsonl
    from agentrft.runtime import (
        batched_sampler,
        job_environment,
        sampling_params,
        settings_from_job,
    )

    job = load_job(args.job)
    train = load_dataset(job.training_path)  # both files are checked before any work
    val = load_dataset(job.validation_path) if job.validation_path else None
    items = val if args.split == "validation" and val else train
    if args.split == "validation" and val is None:
        raise AgentRFTError(f"{args.job}: --split validation needs `validation_file` in the job")
    items = items[: args.rows] if args.rows else items
    out = new_output_dir(args.out, "rollout", job.agentrft.output_dir)
    console.print(
        f"[bold]agentrft rollout[/] {args.job}: {len(items)} rows x {args.n} rollouts, model {args.model or job.model}"
    )
    policy = HFPolicy.load(args.model or job.model, job.agentrft.device, job.agentrft.dtype)
    show_precision(policy.precision)
    with job_environment(job) as base_url:
        settings = settings_from_job(job, policy, base_url)
        params = sampling_params(job, temperature=args.temperature)
        with progress_bar("rollouts", len(items) * args.n) as advance:
            groups, _ = rollout_groups(
                items, args.n, settings, batched_sampler(job, policy, params), advance
            )
    trajs = [t for g in groups for t in g.trajectories]
    write_jsonl(out / "rollouts.jsonl", (to_record(t) for t in trajs))
    for t in trajs[: args.show]:
        show_trajectory(t)
    console.print(summary_table(summarize(trajs), title=f"{len(trajs)} rollouts"))
    console.print(f"wrote {out / 'rollouts.jsonl'}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from agentrft.train.loop import start

    if not args.job and not args.resume:
        raise AgentRFTError("give a job file, or --resume RUN_DIR")
    if args.ray:
        from agentrft.train.on_ray import RAY_ENV

        os.environ[RAY_ENV] = args.ray
    start(args.job, args.out, args.resume)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """A recipe end to end (agentrft/tasks/NAME/demo.py; file selection by default)."""
    from agentrft.tasks import runner as recipes

    demo = recipes.load(args.name)
    job_path = Path(args.job) if args.job else None
    only = {"only": args.variant} if args.variant else {}
    if args.seeds:
        if not callable(getattr(demo, "run_seeds", None)):
            raise ConfigError(f"recipe {args.name!r} has no multi-seed run; run it once per --seed")
        demo.run_seeds(
            Path(args.out or f"runs/demo-{args.name}-seeds"),
            args.seeds,
            steps=args.steps,
            job_path=job_path,
            **only,
        )
    else:
        demo.run(
            Path(
                args.out
                or ("runs/demo" if args.name == recipes.DEFAULT else f"runs/demo-{args.name}")
            ),
            steps=args.steps,
            seed=args.seed,
            job_path=job_path,
            **({"doctor_only": True} if args.doctor_only else {}),
            **only,
        )
    return 0


def cmd_serve_model(args: argparse.Namespace) -> int:
    from agentrft.serve.app import serve_model

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    serve_model(
        args.model,
        host=args.host,
        port=args.port,
        base=args.base,
        name=args.served_model_name,
        max_batch=args.max_batch,
        default_max_tokens=args.default_max_tokens,
        device=args.device,
        dtype=args.dtype,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        max_queued_tokens=args.max_queued_tokens,
        drain_s=args.drain_seconds,
        request_log=args.request_log,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentrft",
        description="Agent reinforcement fine-tuning: baseline, pre-flight, train, compare, serve.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("rollout", help="run K rollouts per row and write rollouts.jsonl")
    r.add_argument("job", help="job file (YAML or JSON, OpenAI's reinforcement job shape)")
    r.add_argument("-n", type=int, default=1, help="rollouts per row (default 1)")
    r.add_argument("--split", choices=["train", "validation"], default="train")
    add_engine_flag(r)
    r.add_argument("--rows", type=int, default=None, help="only the first N rows")
    r.add_argument("--out", default=None, help="output directory (default runs/rollout-TIMESTAMP)")
    r.add_argument("--model", default=None, help="override the job's model")
    r.add_argument("--temperature", type=float, default=None)
    r.add_argument("--show", type=int, default=0, help="print the first N trajectories")
    r.set_defaults(func=cmd_rollout)

    sv = sub.add_parser(
        "serve-model",
        help="serve a base model or a trained checkpoint as an OpenAI-compatible chat endpoint",
    )
    sv.add_argument(
        "model",
        nargs="?",
        default="base",
        help="base (the default model), a model name or path, an adapter folder, or a training run folder (its latest checkpoint)",
    )
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument(
        "--base",
        default=None,
        help="base model for a LoRA adapter (default: the one its adapter_config.json names)",
    )
    sv.add_argument(
        "--served-model-name",
        default=None,
        help="the id clients send as `model` (default: the model's name or folder name)",
    )
    sv.add_argument("--max-batch", type=int, default=32, help="most sequences sampled together")
    sv.add_argument(
        "--default-max-tokens",
        type=int,
        default=512,
        help="reply limit when a request sets no max_tokens",
    )
    sv.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sv.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="auto (default): bf16 where the CPU or GPU computes it natively, else fp32",
    )
    sv.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; 1 is often faster on a busy machine)",
    )
    sv.add_argument(
        "--max-body-mb", type=float, default=16, help="larger request bodies get 413 (default 16)"
    )
    sv.add_argument(
        "--max-queued-tokens",
        type=int,
        default=262_144,
        help="n x max_tokens over all queued requests past which a request gets 429",
    )
    sv.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="after SIGTERM, how long in-flight requests may finish before they are cancelled",
    )
    sv.add_argument(
        "--request-log",
        default=None,
        metavar="FILE",
        help="append every served request to this JSONL file, secrets redacted (off by default; `agentrft doctor JOB --traffic FILE` compares it with the training rows)",
    )
    sv.set_defaults(func=cmd_serve_model)

    t = sub.add_parser("train", help="RL-train the job's model on its tools and grader")
    t.add_argument("job", nargs="?", help="job file (YAML or JSON)")
    t.add_argument("--out", default=None, help="run directory (default runs/train-TIMESTAMP)")
    t.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue a run from its latest checkpoint",
    )
    t.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="train across a Ray cluster (host:port of its head, or auto): engine actors and rollout workers on its nodes, the trainer on this one",
    )
    add_engine_flag(t)
    t.set_defaults(func=cmd_train)

    d = sub.add_parser(
        "demo", help="a recipe end to end on the default model (`make demo` runs file_selection)"
    )
    d.add_argument(
        "name",
        nargs="?",
        default="file_selection",
        help="the recipe: a folder under agentrft/tasks/ (default file_selection)",
    )
    d.add_argument("--out", default=None, help="output folder (default runs/demo)")
    d.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    d.add_argument("--seed", type=int, default=None, help="default: the recipe's")
    d.add_argument(
        "--job",
        default=None,
        help="a variant of the recipe's job, e.g. agentrft/tasks/file_selection/history/job_v6.yaml (default: its job.yaml)",
    )
    d.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="SEED",
        help="run the whole demo once per seed and report the mean gain with a 95%% interval (e.g. --seeds 1 2 3)",
    )
    add_engine_flag(d)
    d.add_argument(
        "--variant",
        default=None,
        metavar="NAME",
        help="measure (and train) only this variant of a recipe with several, e.g. `--variant repair` for code_fix",
    )
    d.add_argument(
        "--doctor-only",
        action="store_true",
        help="build the recipe's data and run `agentrft doctor` on its job(s), nothing else",
    )
    d.set_defaults(func=cmd_demo)

    add_evaluate_commands(sub)
    add_grader_commands(sub)
    add_data_commands(sub)
    add_service_commands(sub)
    return p


def _quiet_libraries(verbose: bool) -> None:
    """Library chatter (weight-loading bars, deprecation notices) hides agentrft's own
    progress; keep it for -v."""
    if verbose:
        return
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextlib.contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """SIGTERM (a `kill`, a container stop) ends the command like Ctrl-C does: `finally`
    blocks run, so the servers it started (an environment, a model server) stop with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_engine_flag(args)
    _quiet_libraries(args.verbose)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    old_umask = os.umask(
        0o077
    )  # what a command writes (jobs, rollouts, checkpoints) is its owner's only
    try:
        with _exit_on_sigterm():
            return int(args.func(args) or 0)
    except AgentRFTError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # not one of ours: one line here, the traceback with -v
        if args.verbose:
            raise
        print(
            f"error: {type(exc).__name__}: {exc} (run again with -v for the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        os.umask(old_umask)


if __name__ == "__main__":
    sys.exit(main())
