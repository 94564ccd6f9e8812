"""Training across a Ray cluster's machines: `agentrft train JOB.yaml --ray ADDRESS` (or
`agentrft: {ray: {address: ...}}` in the job). The same job file runs on a laptop without
Ray.

Three kinds of actors, placed by Ray:
- **the trainer**, one actor on the driver's node (so the run directory, the datasets and
  the checkpoints are where `agentrft train` was started): the async pipeline of
  `train/async_steps.py` (`max_staleness` 0 is the synchronous schedule), the update, the
  eval and the checkpoints;
- **engine actors** (`agentrft.ray.engines`, round-robin over the nodes): the local engine on
  each node (`engine/ray_actors.py`); after each update the adapter's tensors go to them
  through Ray's object store, not through a file system;
- **rollout workers** (`agentrft.ray.rollout_workers`, round-robin too; they reserve no
  CPU, so every node has room): each step's rows are split among
  them; a worker runs the episodes (the model's turns on the engine actors, the tool calls
  from its own node) and grades them. Each worker starts the job's environment server on
  its own node, from the job's folder, which Ray ships to it as its working directory
  (`runtime_env`, `agentrft.ray.excludes`), so no tool call goes to another node's
  loopback and no node needs the trainer's disk.

What every node needs: agentrft installed in the same Python environment, and the job's
model (the embedded one is inside the package; another by a path that exists on every node).
The job travels to the actors with its secrets: run the cluster on a private network.

The cluster's layout (which actor runs on which node, by address) is written to the run's
`cluster.json`, and each step's metrics count the engine requests that had to be sent again
after an engine actor died (`engine/retried_requests`, `engine/actors_lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrft.console import console
from agentrft.engine import ServedModel
from agentrft.engine.ray_actors import EnginePool, RayEngine, RaySampler, round_robin, where
from agentrft.errors import AgentRFTError, ConfigError
from agentrft.graders import build_grader, grade_rollouts
from agentrft.job import Job
from agentrft.policy import SamplingParams
from agentrft.policy.models import resolve_model
from agentrft.rollout.group import run_groups_async
from agentrft.runtime import job_environment, settings_from_job
from agentrft.types import Group, Item

RAY_ENV = "AGENTRFT_RAY_ADDRESS"  # set by `agentrft train --ray`; overrides agentrft.ray.address


def ray_address(job: Job) -> str | None:
    """The cluster to train on: `--ray` ($AGENTRFT_RAY_ADDRESS), else the job's, else None."""
    return os.environ.get(RAY_ENV) or job.agentrft.ray.address


class RolloutWorker:
    """Runs a share of a step's rollouts and grades them, on its node (a Ray actor)."""

    def __init__(self, job: Job) -> None:
        job._base_dir = Path.cwd()  # the job's folder, shipped here by Ray
        ext = job.agentrft
        self.grader = build_grader(
            job.rl.grader, judge=ext.judge, python_limits=ext.sandbox.limits()
        )
        served = ServedModel.load(resolve_model(job.model), ext.dtype, ext.device)
        self._env = contextlib.ExitStack()
        self.env_url = self._env.enter_context(job_environment(job))
        self.settings = settings_from_job(job, served, self.env_url, self.grader)

    def where(self) -> dict[str, Any]:
        return where()

    async def run(
        self,
        items: list[Item],
        group_size: int,
        first: int,
        params: SamplingParams,
        engines: list[Any],
        adapter: str,
    ) -> tuple[list[Group], dict[str, float], dict[str, float], list[str]]:
        """The graded groups of `items`; the grading stats; the engine metrics; the ids of
        the engine actors found dead."""
        pool = EnginePool(list(engines))
        sampler = RaySampler(pool, params, adapter)
        groups = await run_groups_async(items, group_size, self.settings, sampler, first=first)
        graded, grading = await asyncio.to_thread(grade_rollouts, groups, self.grader, self.env_url)
        lost = [a._actor_id.hex() for a in engines if a not in pool.actors]
        return graded, grading, sampler.metrics(), lost

    def stop(self) -> None:
        self._env.close()


@dataclass
class _Summed:
    values: dict[str, float]

    def metrics(self) -> dict[str, float]:
        return self.values


@dataclass
class RayRollouts:
    """A step's rollouts on the rollout workers (the `RemoteRollouts` of `train.step`)."""

    engine: RayEngine
    workers: list[Any]

    async def produce(
        self,
        rows: list[Item],
        group_size: int,
        params: SamplingParams,
        adapter: str,
        advance: Callable[[int], None],
    ) -> tuple[list[Group], dict[str, float], _Summed]:
        t0 = time.perf_counter()
        n = len(self.workers)
        bounds = [round(i * len(rows) / n) for i in range(n + 1)]
        chunks = [(bounds[i], rows[bounds[i] : bounds[i + 1]]) for i in range(n)]
        engines = list(self.engine.pool.actors)

        async def one(worker: Any, start: int, chunk: list[Item]) -> Any:
            out = await worker.run.remote(
                chunk, group_size, start * group_size, params, engines, adapter
            )
            advance(len(chunk) * group_size)
            return out

        results = await asyncio.gather(
            *(
                one(w, start, chunk)
                for w, (start, chunk) in zip(self.workers, chunks, strict=True)
                if chunk
            )
        )
        groups = [g for graded, *_ in results for g in graded]
        lost = {actor_id for *_, ids in results for actor_id in ids}
        for actor in list(self.engine.pool.actors):
            if actor._actor_id.hex() in lost:
                self.engine.pool.forget(actor)
        summed: dict[str, float] = {}
        for _, _, metrics, _ in results:
            for k, v in metrics.items():
                summed[k] = summed.get(k, 0.0) + v
        summed["engine/actors_lost"] = float(self.engine.pool.lost)
        summed["engine/actors"] = float(len(self.engine.pool.actors))
        stats = {
            "time/sampling_s": time.perf_counter() - t0,  # rollouts and grades, on the workers
            "time/grading_s": max(r[1].get("time/grading_s", 0.0) for r in results),
        }
        return groups, stats, _Summed(summed)


@contextlib.contextmanager
def ray_cluster(job: Job, model: Any, run_dir: Path) -> Iterator[tuple[RayEngine, RayRollouts]]:
    """The run's engine actors and rollout workers, stopped with the run; their layout in
    `run_dir/cluster.json`."""
    import ray

    ext, spec = job.agentrft, job.agentrft.ray
    if not hasattr(model, "peft_config"):
        raise ConfigError(
            "training on Ray syncs a LoRA adapter into the engine actors: full-weight training "
            "(agentrft.train.full_finetune) cannot run there yet"
        )
    console.print(
        f"ray: starting {spec.engines} engine actor(s) and {spec.rollout_workers} rollout worker(s)"
    )
    engine = RayEngine.start(
        spec.engines,
        job.model,
        ext.device,
        ext.dtype,
        model.peft_config["default"],
        ext.sampling.max_batch,
        ext.sampling.kv_cache_mb,
        num_cpus=spec.engine_cpus,
        num_gpus=spec.engine_gpus,
    )
    worker_cls: Any = ray.remote(RolloutWorker)
    workers: list[Any] = [
        worker_cls.options(
            num_cpus=0, max_restarts=0, scheduling_strategy=round_robin(i, soft=False)
        ).remote(job)
        for i in range(spec.rollout_workers)
    ]
    try:
        placed = ray.get([w.where.remote() for w in workers])
        layout = {"trainer": where(), "engines": engine.placed, "rollout_workers": placed}
        (run_dir / "cluster.json").write_text(json.dumps(layout, indent=2))
        nodes = sorted({p["node_ip"] for p in [*engine.placed, *placed]})
        console.print(f"ray: engines and workers on {len(nodes)} node(s): {', '.join(nodes)}")
        yield engine, RayRollouts(engine, workers)
    finally:
        with contextlib.suppress(Exception):
            ray.get([w.stop.remote() for w in workers], timeout=30)
        for w in workers:
            with contextlib.suppress(Exception):
                ray.kill(w)
        engine.stop()


class TrainerActor:
    """The trainer on the driver's node (a Ray actor)."""

    def __init__(self, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))

    def train(self, job: Job, run_dir: str, resume: bool) -> str:
        from agentrft.train.loop import train

        return str(train(job, Path(run_dir), resume, on_ray=True))


def train_on_ray(job: Job, run_dir: Path, resume: bool, address: str) -> Path:
    """Connect to the cluster at `address`, run the trainer actor on this node, wait."""
    try:
        import ray
        from ray.exceptions import RayTaskError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise ConfigError(
            "--ray needs Ray: pip install 'agentrft[ray]' (on every node of the cluster)"
        ) from None
    job._base_dir = job.resolve_path(".").resolve()  # the trainer's working directory moves
    spec = job.agentrft.ray
    # the job's folder goes to every actor as its working directory (uploaded once, from
    # here): the rollout workers run its environment app on their own nodes
    ray.init(
        address=address,
        namespace="agentrft",
        log_to_driver=True,
        runtime_env={"working_dir": str(job._base_dir), "excludes": list(spec.excludes)},
    )
    try:
        here = ray.get_runtime_context().get_node_id()
        threads = os.cpu_count() or 1
        trainer: Any = (
            ray.remote(TrainerActor)
            .options(
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
            )
            .remote(threads)
        )
        try:
            return Path(ray.get(trainer.train.remote(job, str(run_dir), resume)))
        except RayTaskError as exc:  # the trainer's own error, as it would be without Ray
            if isinstance(exc.cause, AgentRFTError):
                raise exc.cause from None
            raise
        except BaseException:
            ray.kill(trainer)
            raise
    finally:
        ray.shutdown()
