"""The stages of one training step, as the loops call them (`train.loop`, synchronous, and
`train.async_steps`, rollouts ahead of the update):

    roll_out (rows -> rollouts -> grades) -> learn (advantages -> update) -> publish (eval ->
    metrics -> checkpoint)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from agentrft.console import console, progress_bar
from agentrft.engine import Engine, adapter_version
from agentrft.errors import AgentRFTError
from agentrft.evaluate.eval import eval_results, graded_records, reward_stats
from agentrft.graders import grade_rollouts
from agentrft.graders.protocol import Grader
from agentrft.job import Job, Resolved
from agentrft.memory import peak_rss_mb, release_free_memory, reset_peak_rss
from agentrft.policy import SamplingParams
from agentrft.policy.hf import HFPolicy
from agentrft.rollout.batching import Sampler
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import rollout_groups
from agentrft.rollout.records import summarize
from agentrft.runtime import sampling_params
from agentrft.seeds import EPOCH_STRIDE, EVAL_OFFSET, STEP_STRIDE
from agentrft.train.advantages import rollouts_with_advantage
from agentrft.train.checkpoint import TrainState, save_checkpoint
from agentrft.train.engine_check import check_engine
from agentrft.train.hack_watch import HackWatch
from agentrft.train.observe import RunLog
from agentrft.train.settings import normalize_std
from agentrft.train.update import UpdateConfig, update_policy
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


class HasMetrics(Protocol):
    def metrics(self) -> dict[str, float]: ...


@dataclass
class Batch:
    """One step's graded rollouts, and how they were made."""

    step: int  # 0-based: trained by the update that makes version step + 1
    groups: list[Group]
    sampler: HasMetrics  # the step's sampler: its metrics go into the step's
    sampled_with: str  # the engine's adapter for every rollout of the step
    stats: dict[str, float]  # time/sampling_s, time/grading_s, memory peaks


class RemoteRollouts(Protocol):
    """Rollouts and grades made elsewhere (rollout workers on a Ray cluster)."""

    async def produce(
        self,
        rows: list[Item],
        group_size: int,
        params: SamplingParams,
        adapter: str,
        advance: Callable[[int], None],
    ) -> tuple[list[Group], dict[str, float], HasMetrics]:
        """The rows' graded groups, the phase's stats, and the engine's metrics; `advance(n)`
        as n more rollouts are done."""
        ...


@dataclass
class Run:
    """What every stage of a step needs: the setup, the run's log, the rollout settings and
    the open engine and environment."""

    s: Setup
    log: RunLog
    ucfg: UpdateConfig
    watch: HackWatch
    settings: RolloutSettings
    env_url: str | None
    engine: Engine
    run_dir: Path
    remote: RemoteRollouts | None = None  # rollout workers on a cluster (train/on_ray.py)

    def step_params(self, step: int) -> SamplingParams:
        return sampling_params(self.s.job, seed=self.s.job.seed * STEP_STRIDE + step)

    def step_sampler(self, step: int) -> Sampler:
        ext = self.s.job.agentrft
        return self.engine.sampler(
            self.step_params(step), ext.sampling.max_batch, ext.sampling.kv_cache_mb
        )

    def rows(self, step: int) -> list[Item]:
        return batch_rows(self.s.train_items, self.s.hp, step, self.s.job.seed)

    def eval_due(self, step: int) -> bool:
        hp = self.s.hp
        return bool(
            self.s.val_items
            and hp.eval_interval
            and (step % hp.eval_interval == 0 or step == hp.total_steps)
        )


def roll_out(run: Run, step: int) -> Batch:
    """Stages 1-3 of `step`: its rows, their rollouts on the engine's current weights, grades."""
    hp = run.s.hp
    sampler = run.step_sampler(step)
    sampled_with = run.engine.adapter
    with progress_bar(
        f"step {step + 1}/{hp.total_steps} rollouts", hp.batch_size * hp.group_size
    ) as advance:
        groups, sampling = rollout_groups(
            run.rows(step), hp.group_size, run.settings, sampler, advance
        )
    groups, grading = grade_rollouts(groups, run.s.grader, run.env_url)
    return Batch(step, groups, sampler, sampled_with, {**sampling, **grading})


def learn(run: Run, batch: Batch, sync: bool = True) -> dict[str, Any]:
    """Stages 4-5 of `batch`'s step: advantages and the update; then (`sync`) the engine gets
    the new weights. Returns the step's metrics, its rollouts logged and hack-watched."""
    s, ext = run.s, run.s.job.agentrft
    step = batch.step
    failures = check_failures(batch.groups, step + 1, ext.train.max_failed_fraction)
    # 4. advantages (group-relative; no spread, no signal)
    scored, adv_stats = rollouts_with_advantage(batch.groups, normalize_std(s.job))
    # 5. update
    reset_peak_rss()
    upd = update_policy(s.model, s.optimizer, scored, run.ucfg)
    # the engine check: were these rollouts sampled from the policy just trained on?
    check_engine(
        {**upd, **batch.sampler.metrics()},
        ext.engine_check,
        step + 1,
        run.engine.kind,
        batch.sampled_with,
        staleness=step - adapter_version(batch.sampled_with),
    )
    if sync:
        upd.update(run.engine.sync(s.model, step + 1))  # the next step samples the new weights
    upd["memory/update_peak_mb"] = peak_rss_mb()
    release_free_memory()  # else the update's peak stays resident (see agentrft/memory.py)
    s.state.step = step + 1
    trajs = [t for g in batch.groups for t in g.trajectories]
    metrics: dict[str, Any] = {
        **reward_stats(batch.groups),
        **failures,
        **adv_stats,
        **upd,
        **batch.stats,
        "rollouts": summarize(trajs),
        **batch.sampler.metrics(),
        "epoch": step // s.hp.steps_per_epoch,
    }
    records = graded_records(batch.groups, step=s.state.step)
    run.log.rollouts(f"step-{s.state.step}", records)
    metrics |= run.watch.observe(s.state.step, records)  # reward-hacking flags, readings
    return metrics


def publish(run: Run, step: int, metrics: dict[str, Any], sampled_with: str) -> None:
    """Stages 6-7 after the update that made version `step`: the held-out eval when due (the
    engine must be on the new weights), the metrics line, then the checkpoint."""
    s, ext = run.s, run.s.job.agentrft
    # 6. eval
    if run.eval_due(step):
        metrics["eval"] = evaluate(s, run.settings, run.env_url, run.log, step, run.engine)
    run.log.log(step, metrics, {"engine": run.engine.kind, "sampled_with": sampled_with})
    # 7. checkpoint, after the step's metrics are on disk: a kill between the two loses
    # nothing (resume drops lines past its checkpoint and redoes those steps)
    if step % ext.train.checkpoint_interval == 0 or step == s.hp.total_steps:
        save_checkpoint(run.run_dir, s.model, s.optimizer, s.state)
    _print_step(step, s.hp.total_steps, metrics)


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
