"""Async steps: the rollouts of later steps run while an earlier step updates.

With `agentrft.train.max_staleness` k above 0, step s samples with the weights of version
v(s) = max(first, s - k), where version v is the weights after v updates and `first` is the
step this process started at (0, or the checkpoint's step on resume). The pipeline keeps
that exact schedule, so a seeded run gives the same numbers however fast its tools answer:

    after the update that makes version t:  the engine gets version t (the handoff),
    the step-t metrics and eval are published, step t + k is launched on version t, and
    the trainer waits for step t's graded rollouts, then updates.

While step t updates, steps t+1 .. t+k roll out and are graded, so the user's tools and
grader work through the update instead of waiting for it. k = 0 is the synchronous loop of
`train.loop`, stage for stage (a test checks the numbers are the same).

Rollouts in flight when a newer version is published **finish on the version they started
with** (counted per step, `async/finished_on_old_version`): the vLLM engine keeps k + 1
adapters loaded, and the local engine's single sampling copy is rewritten only at a handoff,
once no rollout of an older version is still sampling. Finishing on the old version keeps
every rollout one policy's sample (its KV cache and its log-probs agree), and keeps seeded
runs reproducible; the price on the local engine is that a long tail delays the next step's
launch (never the update, which needs that tail anyway).

Off-policy rollouts are corrected by truncated importance weights min(p_trainer /
p_engine, tis_cap) from the engine's recorded log-probs (`tis_cap`, on at 2.0 by default for
async steps). A batch older than k updates is never trained on: its rollouts are discarded
with the reason and counted (`async/dropped_stale`). The schedule above never makes one; the
check is there so that a change to it cannot train on stale rollouts unseen.

The model's work (sampling batches on the local engine, the update, eval, checkpoints)
runs on the thread that loaded the model (`rollout.caller_thread` says why); the episodes,
tool calls and grading run beside it on the event loop and in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from agentrft.console import console, progress_bar
from agentrft.engine import adapter_version
from agentrft.graders import grade_rollouts
from agentrft.rollout.caller_thread import on_caller, run_with_caller
from agentrft.rollout.group import run_groups_async
from agentrft.train.step import Batch, Run, learn, publish
from agentrft.types import Group, Trajectory


def drop_stale(batch: Batch, step: int, max_staleness: int) -> tuple[Batch, int]:
    """`batch` for the update of `step`, with every rollout discarded when it was sampled more
    than `max_staleness` updates ago; and how many were."""
    staleness = step - adapter_version(batch.sampled_with)
    if staleness <= max_staleness:
        return batch, 0
    why = (
        f"sampled with {batch.sampled_with}, {staleness} updates before the update of step "
        f"{step + 1}: above agentrft.train.max_staleness {max_staleness}"
    )
    groups = [
        Group(
            g.item,
            tuple(
                t if t.discarded else dataclasses.replace(t, discarded=why) for t in g.trajectories
            ),
            g.grades,
        )
        for g in batch.groups
    ]
    dropped = sum(1 for g in batch.groups for t in g.trajectories if not t.discarded)
    return dataclasses.replace(batch, groups=groups), dropped


@dataclass
class _Pipeline:
    run: Run
    max_staleness: int
    tasks: dict[int, asyncio.Task[Batch]] = field(default_factory=dict)
    sampling: dict[int, asyncio.Event] = field(default_factory=dict)  # set: rollouts done
    ended: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> trace -> end time
    made: dict[int, float] = field(default_factory=dict)  # version -> when the update made it
    waited_s: float = 0.0  # the trainer's wait for the engine and for rollouts, this step

    def launch(self, step: int) -> None:
        self.sampling[step] = asyncio.Event()
        self.tasks[step] = asyncio.create_task(self._produce(step))

    async def _produce(self, step: int) -> Batch:
        run, hp = self.run, self.run.s.hp
        sampled_with = run.engine.adapter
        ended = self.ended.setdefault(step, {})
        t0 = time.perf_counter()
        label = f"step {step + 1}/{hp.total_steps} rollouts ({sampled_with})"
        try:
            with progress_bar(label, hp.batch_size * hp.group_size) as advance:
                if run.remote is not None:  # rollout workers sample and grade

                    def advance_by(n: int) -> None:
                        for _ in range(n):
                            advance()

                    groups, stats, metrics = await run.remote.produce(
                        run.rows(step),
                        hp.group_size,
                        run.step_params(step),
                        sampled_with,
                        advance_by,
                    )
                    return Batch(step, groups, metrics, sampled_with, stats)
                sampler = run.step_sampler(step)

                def done(traj: Trajectory) -> None:
                    ended[traj.trace_id] = time.perf_counter()
                    advance()

                groups = await run_groups_async(
                    run.rows(step), hp.group_size, run.settings, sampler, done
                )
        finally:
            self.sampling[step].set()
        sampled = time.perf_counter() - t0
        groups, grading = await asyncio.to_thread(grade_rollouts, groups, run.s.grader, run.env_url)
        return Batch(step, groups, sampler, sampled_with, {"time/sampling_s": sampled, **grading})

    async def handoff(self, version: int) -> None:
        """The engine samples version `version` from now on (the trainer's weights now). The
        vLLM engine got it in the update's sync; the local engine's one sampling copy is
        rewritten here, after every rollout still sampling an older version has ended."""
        engine = self.run.engine
        if adapter_version(engine.adapter) == version:
            return
        t0 = time.perf_counter()
        for event in self.sampling.values():
            await event.wait()
        await on_caller(engine.sync, self.run.s.model, version)
        self.waited_s += time.perf_counter() - t0

    async def batch(self, step: int) -> Batch:
        t0 = time.perf_counter()
        batch = await self.tasks.pop(step)
        self.waited_s += time.perf_counter() - t0
        del self.sampling[step]
        return batch

    def step_metrics(
        self, batch: Batch, step: int, dropped: int, period_s: float
    ) -> dict[str, float]:
        version = adapter_version(batch.sampled_with)
        newer = self.made.get(version + 1)
        ends = self.ended.pop(step, {}).values()
        rollouts = sum(len(g.trajectories) for g in batch.groups)
        busy = batch.sampler.metrics().get("sampler/busy_s")
        out = {
            "async/staleness": float(step - version),
            "async/dropped_stale": float(dropped),
            # sampled with older weights than the update's: trained with importance weights
            "async/off_policy_rollouts": float(rollouts - dropped if step > version else 0),
            "async/finished_on_old_version": float(
                0 if newer is None else sum(1 for end in ends if end > newer)
            ),
            "time/step_s": period_s,
            "time/trainer_idle_s": self.waited_s,
        }
        if busy is not None:
            out["engine/busy_share"] = min(1.0, busy / max(period_s, 1e-9))
        return out


async def _train(run: Run, first: int, total: int, max_staleness: int) -> None:
    p = _Pipeline(run, max_staleness)
    single = run.engine.versions == 1  # one sampling copy: rewritten at each handoff
    pending: tuple[int, dict[str, Any], str] | None = None  # step, metrics, sampled_with
    last = time.perf_counter()
    try:
        await p.handoff(first)
        for s in range(first, min(first + max_staleness, total)):  # all on version `first`
            p.launch(s)
        for t in range(first, total):
            if t > first:
                await p.handoff(t)
            if pending is not None:
                await on_caller(publish, run, *pending)
            if t + max_staleness < total:
                p.launch(t + max_staleness)
            batch, dropped = drop_stale(await p.batch(t), t, max_staleness)
            metrics = await on_caller(learn, run, batch, not single)
            p.made[t + 1] = now = time.perf_counter()
            metrics |= p.step_metrics(batch, t, dropped, now - last)
            metrics["time/trainer_idle_share"] = p.waited_s / max(now - last, 1e-9)
            last, p.waited_s = now, 0.0
            pending = (t + 1, metrics, batch.sampled_with)
        if pending is not None:
            if run.eval_due(pending[0]):
                await p.handoff(pending[0])
            await on_caller(publish, run, *pending)
    finally:
        for task in p.tasks.values():
            task.cancel()
        for task in p.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def train_async(run: Run, first: int, total: int, max_staleness: int) -> None:
    """Steps `first` .. `total - 1` of `run`, rollouts up to `max_staleness` steps ahead."""
    if run.engine.versions == 1 and max_staleness > 1:
        console.print(
            f"async steps: the local engine samples one version at a time, so steps "
            f"{max_staleness} ahead launch only as the older rollouts end"
        )
    run_with_caller(_train(run, first, total, max_staleness))
