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

The stages of a step are in `train/step.py`. With `agentrft.train.max_staleness` 0 (the
default) the loop below runs them one after another. Above 0, `train/async_steps.py` runs a
step's rollouts while the update of an earlier one runs.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from agentrft.console import console, show_precision
from agentrft.data import load_dataset
from agentrft.engine import Engine, choose_engine, open_engine
from agentrft.errors import AgentRFTError, ConfigError
from agentrft.graders import build_grader
from agentrft.job import Job, job_from_dict, load_job, resolve_hyperparameters
from agentrft.policy.hf import HFPolicy
from agentrft.policy.models import resolve_model
from agentrft.redact import restore_secrets
from agentrft.rollout.records import new_output_dir
from agentrft.runtime import job_environment, settings_from_job
from agentrft.train.async_steps import train_async
from agentrft.train.checkpoint import (
    TrainState,
    export_final,
    latest_checkpoint,
    load_checkpoint,
    make_optimizer,
    make_trainable,
)
from agentrft.train.hack_watch import HackWatch
from agentrft.train.observe import RunLog, read_metrics
from agentrft.train.on_ray import RayRollouts, ray_address, ray_cluster, train_on_ray
from agentrft.train.run_files import read_run_files, write_run_files
from agentrft.train.settings import update_config
from agentrft.train.step import (
    Run,
    Setup,
    evaluate,
    learn,
    publish,
    roll_out,
)


def prepare(job: Job, run_dir: Path, resume: bool, on_ray: bool = False) -> Setup:
    """Validate everything first (datasets, grader), then load the model and any checkpoint.
    `on_ray`: engine actors sample (train/on_ray.py), so the trainer keeps no sampling copy."""
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
    if on_ray and engine != "local":
        raise ConfigError(
            f"{job.source}: on Ray, agentrft runs its own engine on the actors; vLLM engine "
            "actors are not built yet (use --engine local with --ray)"
        )
    console.print(f"engine: {engine} ({why})" + (", on Ray engine actors" if on_ray else ""))
    policy = HFPolicy.load(
        job.model,
        ext.device,
        ext.dtype,
        for_training=True,
        sampling_copy=engine == "local" and not on_ray,
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


def train(
    job: Job,
    run_dir: Path,
    resume: bool = False,
    async_steps: bool | None = None,
    on_ray: bool = False,
) -> Path:
    """Train `job` into `run_dir`. `async_steps`: run the async pipeline (None: when
    `agentrft.train.max_staleness` is above 0; True at 0 runs it on the synchronous
    schedule, which gives the synchronous loop's numbers). `on_ray`: this is the trainer
    actor of a Ray run (`train/on_ray.py`): engine actors and rollout workers do the
    rollouts, through the async pipeline."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(
        0o700
    )  # its job, rollouts and checkpoints are its owner's only, however it was started
    s = prepare(job, run_dir, resume, on_ray)
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
    staleness = ext.train.max_staleness
    ucfg = update_config(
        job, bf16=s.policy.dtype == "bf16", engine=s.engine, off_policy=staleness > 0
    )
    watch = HackWatch.for_job(job, run_dir, read_metrics(run_dir) if resume else ())
    with contextlib.ExitStack() as stack:
        env_url = stack.enter_context(job_environment(job))
        remote: RayRollouts | None = None
        engine: Engine
        if on_ray:
            engine, remote = stack.enter_context(ray_cluster(job, s.model, run_dir))
        else:
            engine = stack.enter_context(
                open_engine(
                    job,
                    s.policy,
                    run_dir,
                    s.engine,
                    resolve_model(job.model),
                    versions=staleness + 1,
                )
            )
        settings = settings_from_job(
            job, s.policy, env_url, s.grader
        )  # the grader's tool budget caps calls
        run = Run(s, log, ucfg, watch, settings, env_url, engine, run_dir, remote)
        if s.state.step > 0:  # resumed: the engine gets the checkpoint's weights and name
            engine.sync(s.model, s.state.step)
        if s.val_items and s.state.step == 0:
            res = evaluate(s, settings, env_url, log, 0, engine)
            log.log(0, {"eval": res})
            console.print(
                f"step 0 eval: reward {res['reward']['mean']:.3f}  tool calls p50 {res['tool_calls']['p50']:.0f} p95 {res['tool_calls']['p95']:.1f}"
            )
        if on_ray or async_steps or (async_steps is None and staleness > 0):
            console.print(
                f"async steps: rollouts run up to {staleness} step(s) ahead of the update"
            )
            train_async(run, s.state.step, hp.total_steps, staleness)
        else:
            for step in range(s.state.step, hp.total_steps):
                t0 = time.perf_counter()
                batch = roll_out(run, step)  # 1-3: rows, rollouts, grades
                metrics = learn(run, batch)  # 4-5: advantages, update, engine sync
                metrics["time/step_s"] = time.perf_counter() - t0
                metrics["time/trainer_idle_s"] = (
                    batch.stats["time/sampling_s"] + batch.stats["time/grading_s"]
                )  # the update waits for every rollout and grade of its step
                publish(run, step + 1, metrics, batch.sampled_with)  # 6-7: eval, checkpoint
    log.close()
    merged = export_final(run_dir, s.model, s.policy.tokenizer)
    console.print(f"done: {run_dir}  (merged model: {merged})")
    return run_dir


def start(job_path: str, run_dir: str | None = None, resume: str | None = None) -> Path:
    """CLI entry: a new run from a job file, or `--resume RUN_DIR`; on a Ray cluster when
    `--ray` or the job's `agentrft.ray.address` names one (train/on_ray.py)."""
    if resume:
        rd = Path(resume)
        job = _resumed_job(rd, job_path)
    else:
        job = load_job(job_path)
        rd = new_output_dir(run_dir, "train", job.agentrft.output_dir)
        write_run_files(rd, job, str(Path(job_path).resolve()), job.resolve_path("."))
    address = ray_address(job)
    if address:
        return train_on_ray(job, rd.resolve(), bool(resume), address)
    return train(job, rd, resume=bool(resume))


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
