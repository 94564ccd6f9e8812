"""The local engine on Ray actors: sampling spread over a cluster's nodes (`--ray ADDRESS`).

Each engine actor loads the job's model on its own node (agentrft installed there, and the
model: the embedded one ships inside the package, others by a path that exists on every
node), wraps it with the run's LoRA layout (the trainer's `LoraConfig`), and samples with
agentrft's batched sampler (`rollout.batching`, KV caches kept per rollout). After each
update the trainer sends the adapter's tensors through Ray's object store
(`RayEngine.sync`): one `ray.put`, every actor loads the same object. No file system is
shared: no path crosses from the trainer to an engine.

Requests of one rollout go to the same actor (its KV cache is there). When an actor dies,
its requests are sent again to another live one (counted as `engine/retried_requests`,
with `engine/actors_lost`); the seeded requests give the same tokens wherever they run.
Only when no actor is left does sampling fail (EngineUnavailable), which the episode
counts as a discarded rollout, never a scored 0.

Every reply carries the version the actor held when it sampled, so a reply from another
version than the step asked for is counted as `engine/wrong_adapter`, and the engine check
stops the run (`train/engine_check.py`). Ray is imported only here, and only for `--ray`.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrft.errors import ConfigError, EngineUnavailable
from agentrft.policy import Completion, SamplingParams
from agentrft.rollout.batching import BatchedSampler

RAY, BASE = "ray", "base"


def where() -> dict[str, Any]:
    """Where the calling process runs: its node's address, host name and process id (what
    `cluster.json` records for each actor)."""
    import ray

    return {
        "node_ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


class EngineActor:
    """One engine on one node (a Ray actor: `RayEngine.start` makes it remote)."""

    def __init__(
        self,
        model: str,
        device: str,
        dtype: str,
        lora: Any,
        max_batch: int,
        kv_cache_mb: int,
    ) -> None:
        from peft import get_peft_model

        from agentrft.policy.hf import HFPolicy

        self.policy = HFPolicy.load(model, device, dtype, for_training=True, sampling_copy=True)
        self.policy.model = get_peft_model(self.policy.model, lora)
        self.policy.model.requires_grad_(False)
        self.version = BASE
        self.in_flight = 0
        self.sampler = BatchedSampler(
            self.policy, SamplingParams(), max_batch=max_batch, kv_cache_mb=kv_cache_mb
        )

    def where(self) -> dict[str, Any]:
        return where()

    async def sample(
        self,
        tokens: Sequence[int],
        max_new: int,
        seed: int | None,
        params: SamplingParams,
        key: Hashable | None,
    ) -> tuple[Completion, str]:
        version = self.version
        self.in_flight += 1
        try:
            completion = await self.sampler.sample(tokens, max_new, seed, params, key)
        finally:
            self.in_flight -= 1
        return completion, version

    def release(self, key: Hashable) -> None:
        self.sampler.release(key)

    def load(self, version: str, state: dict[str, Any]) -> str:
        """Sample with the adapter tensors `state` from now on, as `version`."""
        from peft import set_peft_model_state_dict

        if self.in_flight:
            raise EngineUnavailable(
                f"engine actor asked to load {version} with {self.in_flight} requests of "
                f"{self.version} still sampling"
            )
        set_peft_model_state_dict(self.policy.model, state)
        self.policy.sync_sampler()
        if self.sampler.kv_cache is not None:  # computed by the old weights
            self.sampler.kv_cache.clear()
        self.version = version
        return version


@dataclass
class EnginePool:
    """The live engine actors, shared by every sampler of a run, and what was lost."""

    actors: list[Any]
    lost: int = 0

    def forget(self, actor: Any) -> None:
        if actor in self.actors:
            self.actors.remove(actor)
            self.lost += 1


@dataclass
class _Stats:
    requests: int = 0
    retried: int = 0
    wrong_adapter: int = 0
    request_s: float = 0.0


class RaySampler:
    """A rollout's sampler on the engine actors (the `Sampler` protocol)."""

    def __init__(self, pool: EnginePool, params: SamplingParams, adapter: str) -> None:
        self.pool = pool
        self.params = params
        self.adapter = adapter
        self.stats = _Stats()
        self._owner: dict[Hashable, Any] = {}

    def _order(self, key: Hashable | None) -> list[Any]:
        actors = list(self.pool.actors)
        if not actors:
            return []
        owner = self._owner.get(key) if key is not None else None
        if owner in actors:
            first = actors.index(owner)
        else:
            first = zlib.crc32(str(key).encode()) % len(actors) if key is not None else 0
        return actors[first:] + actors[:first]

    async def sample(
        self,
        tokens: Sequence[int],
        max_new: int,
        seed: int | None = None,
        params: SamplingParams | None = None,
        key: Hashable | None = None,
    ) -> Completion:
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        for actor in self._order(key):
            try:
                completion, used = await actor.sample.remote(
                    list(tokens), max_new, seed, params or self.params, key
                )
            except RayActorError:  # died (or its node did): the next live actor takes it
                self.pool.forget(actor)
                self.stats.retried += 1
                continue
            if key is not None:
                self._owner[key] = actor
            self.stats.requests += 1
            self.stats.request_s += time.perf_counter() - t0
            if used != self.adapter:
                self.stats.wrong_adapter += 1
            return completion
        raise EngineUnavailable(
            f"no engine actor is left to sample with ({self.pool.lost} lost this run)"
        )

    def release(self, key: Hashable) -> None:
        actor = self._owner.pop(key, None)
        if actor is not None and actor in self.pool.actors:
            actor.release.remote(key)

    def metrics(self) -> dict[str, float]:
        return {
            "engine/requests": float(self.stats.requests),
            "engine/retried_requests": float(self.stats.retried),
            "engine/wrong_adapter": float(self.stats.wrong_adapter),
            "engine/actors_lost": float(self.pool.lost),
            "engine/actors": float(len(self.pool.actors)),
        }

    async def aclose(self) -> None:
        return None


def round_robin(i: int, soft: bool = True) -> Any:
    """Where actor `i` of a kind goes: the i-th alive node (by address, wrapping around);
    `soft`: as a preference, so a node without room leaves Ray free to place it elsewhere."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(
        (n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeManagerAddress"]
    )
    if not nodes:
        return "DEFAULT"
    return NodeAffinitySchedulingStrategy(nodes[i % len(nodes)]["NodeID"], soft=soft)


@dataclass
class RayEngine:
    """The local engine on `len(actors)` Ray actors, spread over the cluster's nodes."""

    pool: EnginePool
    placed: list[dict[str, Any]]  # where each actor runs (EngineActor.where)
    kind: str = RAY
    adapter: str = BASE
    versions: int = 1  # every actor holds one copy of the weights
    sync_s: list[float] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        count: int,
        model: str,
        device: str,
        dtype: str,
        lora: Any,
        max_batch: int,
        kv_cache_mb: int,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
    ) -> RayEngine:
        """`count` engine actors, placed round-robin over the nodes (`round_robin`), loaded."""
        import ray

        remote: Any = ray.remote(EngineActor)
        actors: list[Any] = [
            remote.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                max_restarts=0,
                scheduling_strategy=round_robin(i),
            ).remote(model, device, dtype, lora, max_batch, kv_cache_mb)
            for i in range(count)
        ]
        placed = ray.get([a.where.remote() for a in actors])
        return cls(EnginePool(actors), placed)

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> RaySampler:
        return RaySampler(self.pool, params, self.adapter)

    def sync(self, model: Any, step: int) -> dict[str, float]:
        """The trainer's adapter tensors, put once into the object store, loaded by every
        live actor; sampling uses them from the next request on."""
        import ray
        from peft import get_peft_model_state_dict
        from ray.exceptions import RayActorError

        if not hasattr(model, "peft_config"):
            raise ConfigError(
                "full-weight training cannot sync into Ray engine actors yet: train a LoRA "
                "adapter (agentrft.train.full_finetune: false) or train without --ray"
            )
        t0 = time.perf_counter()
        name = f"step-{step}"
        state = {k: v.detach().to("cpu") for k, v in get_peft_model_state_dict(model).items()}
        ref = ray.put(state)
        for actor in list(self.pool.actors):
            try:
                ray.get(actor.load.remote(name, ref))
            except RayActorError:
                self.pool.forget(actor)
        if not self.pool.actors:
            raise EngineUnavailable("every Ray engine actor is gone")
        self.adapter = name
        spent = time.perf_counter() - t0
        self.sync_s.append(spent)
        return {"engine/sync_s": spent, "engine/adapter_step": float(step)}

    def stop(self) -> None:
        import ray

        for actor in self.pool.actors:
            ray.kill(actor)
        self.pool.actors.clear()
