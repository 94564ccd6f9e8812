"""The training loop, top to bottom:

    rows -> rollouts (policy <-> tools) -> grades -> group advantages -> update -> eval -> checkpoint

Each stage is one call into the package of that name: rollouts from `rollout/`, grades
and rewards from `graders/`, advantages and the update from `train/`, evaluation from
`evaluate/`; `agentrft.runtime` turns the job into their settings. One step takes
`batch_size` rows, runs a group of rollouts per row, grades every rollout with the user's
grader, turns rewards into group-relative advantages (groups with no reward spread are
skipped) and updates the weights on the sampled tokens (one optimiser step per PPO epoch).
The step's metrics, its evaluation included, are written before its checkpoint, so a run
resumes to the exact step and its metrics have no gap.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrft.console import console, progress_bar, show_precision
from agentrft.data import load_dataset
from agentrft.engine import Engine, choose_engine, open_engine
from agentrft.errors import AgentRFTError, ConfigError
from agentrft.evaluate.eval import eval_results, graded_records, reward_stats
from agentrft.graders import build_grader, grade_rollouts
from agentrft.graders.protocol import Grader
from agentrft.job import Job, Resolved, job_from_dict, load_job, resolve_hyperparameters
from agentrft.memory import peak_rss_mb, release_free_memory, reset_peak_rss
from agentrft.policy.hf import HFPolicy
from agentrft.policy.models import resolve_model
from agentrft.redact import restore_secrets
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import rollout_groups
from agentrft.rollout.records import new_output_dir, summarize
from agentrft.runtime import job_environment, sampling_params, settings_from_job
from agentrft.seeds import EPOCH_STRIDE, EVAL_OFFSET, STEP_STRIDE
from agentrft.train.advantages import rollouts_with_advantage
from agentrft.train.checkpoint import (
    TrainState,
    export_final,
    latest_checkpoint,
    load_checkpoint,
    make_optimizer,
    make_trainable,
    save_checkpoint,
)
from agentrft.train.engine_check import check_engine
from agentrft.train.hack_watch import HackWatch
from agentrft.train.observe import RunLog, read_metrics
from agentrft.train.run_files import read_run_files, write_run_files
from agentrft.train.settings import normalize_std, update_config
from agentrft.train.update import update_policy
from agentrft.types import Group, Item


class TrainingAborted(AgentRFTError):
    """Too many rollouts of a step failed; continuing would train on a biased sample."""


def batch_rows(items: list[Item], hp: Resolved, step: int, seed: int) -> list[Item]:
    """The rows of `step`: each epoch is a fresh seeded permutation, read in order."""
    epoch, k = divmod(step, hp.steps_per_epoch)
    order = list(range(len(items)))
    random.Random(seed * EPOCH_STRIDE + epoch).shuffle(order)
    return [items[i] for i in order[k * hp.batch_size : (k + 1) * hp.batch_size]]


def check_failures(groups: list[Group], step: int, limit: float) -> dict[str, float]:
    """How many rollouts were discarded and how many grades failed; past `limit` (a share of
    the step's rollouts) the step aborts with the reasons, since the rest is a biased sample."""
    trajs = [t for g in groups for t in g.trajectories]
    discarded = [t for t in trajs if t.discarded]
    failed = [gr for g in groups for gr in g.grades if gr is not None and gr.error]
    share = (len(discarded) + len(failed)) / max(1, len(trajs))
    if share > limit:
        reasons = sorted(
            {(t.discarded or "")[:160] for t in discarded}
            | {f"grader: {gr.error}" for gr in failed}
        )
        raise TrainingAborted(
            f"step {step}: {len(discarded)} rollouts discarded and {len(failed)} grades failed out of {len(trajs)} (> {limit:.0%}). Reasons:\n  "
            + "\n  ".join(reasons[:10])
        )
    return {
        "rollouts/discarded": float(len(discarded)),
        "rollouts/grader_errors": float(len(failed)),
    }


@dataclass
class Setup:
    job: Job
    hp: Resolved
    policy: HFPolicy
    model: Any
    optimizer: torch.optim.Optimizer
    grader: Grader
    train_items: list[Item]
    val_items: list[Item] | None
    state: TrainState
    engine: str  # local | vllm (agentrft.engine, resolved for this machine)


def prepare(job: Job, run_dir: Path, resume: bool) -> Setup:
    """Validate everything first (datasets, grader), then load the model and any checkpoint."""
    train_items = load_dataset(job.training_path)
    val_items = load_dataset(job.validation_path) if job.validation_path else None
    grader = build_grader(
        job.rl.grader, judge=job.agentrft.judge, python_limits=job.agentrft.sandbox.limits()
    )
    hp = resolve_hyperparameters(job, len(train_items))
    ext = job.agentrft
    engine, why = choose_engine(ext.engine, ext.device)
    if engine == "vllm" and ext.train.full_finetune:
        raise ConfigError(
            f"{job.source}: agentrft.train.full_finetune cannot sync full weights into the vLLM "
            "engine yet; train a LoRA adapter (full_finetune: false) or use --engine local"
        )
    console.print(f"engine: {engine} ({why})")
    policy = HFPolicy.load(
        job.model, ext.device, ext.dtype, for_training=True, sampling_copy=engine == "local"
    )
    model = make_trainable(policy.model, ext.train, job.seed)
    policy.model = model  # trained here; rollouts sample from its synced copy
    optimizer = make_optimizer(model, hp.learning_rate, ext.train.weight_decay)
    state = TrainState(step=0, seed=job.seed)
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise AgentRFTError(f"{run_dir}: no checkpoint to resume from")
        state = load_checkpoint(ckpt, model, optimizer)
        policy.sync_sampler()
        console.print(f"resuming from {ckpt.name} (step {state.step})")
    return Setup(job, hp, policy, model, optimizer, grader, train_items, val_items, state, engine)


def evaluate(
    s: Setup,
    settings: RolloutSettings,
    env_url: str | None,
    log: RunLog,
    step: int,
    engine: Engine,
) -> dict[str, Any]:
    """The held-out evaluation at `step`: rollouts and grades as in training, at the eval
    temperature, summarised by `evaluate/`."""
    assert s.val_items is not None
    ext = s.job.agentrft
    params = sampling_params(
        s.job, seed=s.job.seed + EVAL_OFFSET + step, temperature=ext.train.eval_temperature
    )
    sampler = engine.sampler(params, ext.sampling.max_batch, ext.sampling.kv_cache_mb)
    with progress_bar(f"eval at step {step}", len(s.val_items) * s.hp.eval_samples) as advance:
        groups, _ = rollout_groups(s.val_items, s.hp.eval_samples, settings, sampler, advance)
    groups, _ = grade_rollouts(groups, s.grader, env_url)
    log.rollouts(f"eval-step-{step}", graded_records(groups, step=step))
    return eval_results(groups)


def train(job: Job, run_dir: Path, resume: bool = False) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(
        0o700
    )  # its job, rollouts and checkpoints are its owner's only, however it was started
    s = prepare(job, run_dir, resume)
    hp, ext = s.hp, job.agentrft
    console.print(f"[bold]agentrft train[/] {job.source} -> {run_dir}")
    show_precision(s.policy.precision)
    for name, how in hp.notes.items():
        console.print(f"  {name}: {how}")
    hyper = {
        **{k: v for k, v in vars(hp).items() if k != "notes"},
        "dtype": s.policy.dtype,
        "notes": {**hp.notes, "dtype": s.policy.precision.reason},
    }
    (run_dir / "hyperparameters.json").write_text(json.dumps(hyper, indent=2))
    log = RunLog(run_dir, resume_from_step=s.state.step if resume else None)
    ucfg = update_config(job, bf16=s.policy.dtype == "bf16", engine=s.engine)
    watch = HackWatch.for_job(job, run_dir, read_metrics(run_dir) if resume else ())
    with (
        job_environment(job) as env_url,
        open_engine(job, s.policy, run_dir, s.engine, resolve_model(job.model)) as engine,
    ):
        settings = settings_from_job(
            job, s.policy, env_url, s.grader
        )  # the grader's tool budget caps calls
        if s.state.step > 0 and engine.kind != "local":  # resumed: the engine gets the adapter
            engine.sync(s.model, s.state.step)
        if s.val_items and s.state.step == 0:
            res = evaluate(s, settings, env_url, log, 0, engine)
            log.log(0, {"eval": res})
            console.print(
                f"step 0 eval: reward {res['reward']['mean']:.3f}  tool calls p50 {res['tool_calls']['p50']:.0f} p95 {res['tool_calls']['p95']:.1f}"
            )
        for step in range(s.state.step, hp.total_steps):
            t0 = time.perf_counter()
            # 1. rows
            rows = batch_rows(s.train_items, hp, step, job.seed)
            # 2. rollouts
            sampler = engine.sampler(
                sampling_params(job, seed=job.seed * STEP_STRIDE + step),
                ext.sampling.max_batch,
                ext.sampling.kv_cache_mb,
            )
            sampled_with = engine.adapter
            with progress_bar(
                f"step {step + 1}/{hp.total_steps} rollouts", len(rows) * hp.group_size
            ) as advance:
                groups, sampling = rollout_groups(rows, hp.group_size, settings, sampler, advance)
            # 3. grades
            groups, grading = grade_rollouts(groups, s.grader, env_url)
            failures = check_failures(groups, step + 1, ext.train.max_failed_fraction)
            # 4. advantages (group-relative; no spread, no signal)
            scored, adv_stats = rollouts_with_advantage(groups, normalize_std(job))
            # 5. update
            reset_peak_rss()
            upd = update_policy(s.model, s.optimizer, scored, ucfg)
            # the engine check: were these rollouts sampled from the policy just trained on?
            check_engine(
                {**upd, **sampler.metrics()}, ext.engine_check, step + 1, engine.kind, sampled_with
            )
            upd.update(engine.sync(s.model, step + 1))  # the next step samples the new weights
            upd["memory/update_peak_mb"] = peak_rss_mb()
            release_free_memory()  # else the update's peak stays resident (see agentrft/memory.py)
            s.state.step = step + 1
            trajs = [t for g in groups for t in g.trajectories]
            metrics: dict[str, Any] = {
                **reward_stats(groups),
                **failures,
                **adv_stats,
                **upd,
                **sampling,
                **grading,
                "rollouts": summarize(trajs),
                "time/step_s": time.perf_counter() - t0,
                **sampler.metrics(),
                "epoch": step // hp.steps_per_epoch,
            }
            records = graded_records(groups, step=s.state.step)
            log.rollouts(f"step-{s.state.step}", records)
            metrics |= watch.observe(s.state.step, records)  # reward-hacking flags, readings
            # 6. eval
            if (
                s.val_items
                and hp.eval_interval
                and (s.state.step % hp.eval_interval == 0 or s.state.step == hp.total_steps)
            ):
                metrics["eval"] = evaluate(s, settings, env_url, log, s.state.step, engine)
            log.log(s.state.step, metrics, {"engine": engine.kind, "sampled_with": sampled_with})
            # 7. checkpoint, after the step's metrics are on disk: a kill between the two loses
            # nothing (resume drops lines past its checkpoint and redoes those steps)
            if s.state.step % ext.train.checkpoint_interval == 0 or s.state.step == hp.total_steps:
                save_checkpoint(run_dir, s.model, s.optimizer, s.state)
            _print_step(s.state.step, hp.total_steps, metrics)
    log.close()
    merged = export_final(run_dir, s.model, s.policy.tokenizer)
    console.print(f"done: {run_dir}  (merged model: {merged})")
    return run_dir


def _print_step(step: int, total: int, m: dict[str, Any]) -> None:
    r = m["reward"]
    calls = m["rollouts"]["tool_calls"]
    line = (
        f"step {step}/{total}  reward {r['mean']:.3f}±{r['std']:.3f}  calls p50 {calls['p50']:.0f} p95 {calls['p95']:.1f}  "
        f"signal {int(m['groups/with_signal'])}/{int(m['groups/with_signal'] + m['groups/zero_signal'])}  "
        f"discarded {int(m['rollouts/discarded'])}  "
        f"time {m['time/sampling_s']:.0f}+{m['time/grading_s']:.0f}+{m.get('time/update_s', 0):.0f}s"
    )
    if "eval" in m:
        line += f"  | eval reward {m['eval']['reward']['mean']:.3f}"
    console.print(line)


def start(job_path: str, run_dir: str | None = None, resume: str | None = None) -> Path:
    """CLI entry: a new run from a job file, or `--resume RUN_DIR`."""
    if resume:
        rd = Path(resume)
        return train(_resumed_job(rd, job_path), rd, resume=True)
    job = load_job(job_path)
    rd = new_output_dir(run_dir, "train", job.agentrft.output_dir)
    write_run_files(rd, job, str(Path(job_path).resolve()), job.resolve_path("."))
    return train(job, rd)


def _resumed_job(rd: Path, job_path: str | None) -> Job:
    """The job of run `rd`. Its job.json has no secrets, so they come from the job file again
    (`job_path`, else the file the run started from) when it still matches."""
    if not (rd / "run.json").is_file() or not (rd / "job.json").is_file():
        raise ConfigError(
            f"{rd}: not a training run directory (no run.json and job.json); give the folder `agentrft train` wrote, e.g. --resume runs/train-20250101-120000"
        )
    stored, meta = read_run_files(rd)
    source_path = Path(job_path or meta["job_source"])
    source = None
    if source_path.is_file():
        with contextlib.suppress(ConfigError):
            source = load_job(source_path)
    try:
        data = restore_secrets(
            stored, None if source is None else source.model_dump(mode="json"), str(rd / "job.json")
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if source is not None and data is not stored:
        return source
    return job_from_dict(stored, source=meta["job_source"], base_dir=Path(meta["base_dir"]))
