"""Batch generation across every rollout currently waiting for the model.

Episodes `await sampler.sample(tokens, max_new)`. Requests queue up while the model is busy
(or while other rollouts wait on tools); the worker then takes everything queued and runs
one batched `policy.sample` off the event loop, so HTTP tool calls keep running meanwhile:
on the thread that started the rollouts where they run under `caller_thread.run_with_caller`
(as `rollout.group` runs them), else in a worker thread.

A request may carry a key (its rollout's trace id). With a policy that keeps KV caches (the
HF policy), a keyed request's KV cache is kept after its turn, so the rollout's next turn
prefills only the new tokens (`agentrft.policy.kv_cache`); `release(key)` drops it when the
rollout ends. The kept caches are bounded by `kv_cache_mb`; 0 turns re-use off.

A request may bring its own SamplingParams (the chat server does: each HTTP request has its
own temperature, stop strings, ...). A batch holds requests with equal params, taken in
arrival order, and never mixes seeded with unseeded requests, so a seeded request's reply
does not depend on what else was queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentrft.policy import Completion, Policy, SamplingParams
from agentrft.policy.kv_cache import PrefixCache
from agentrft.rollout.caller_thread import on_caller

# tokens, max_new, seed, params (None: the sampler's own), KV cache key, the caller's future
_Request = tuple[
    Sequence[int],
    int,
    int | None,
    SamplingParams | None,
    Hashable | None,
    "asyncio.Future[Completion]",
]
DEFAULT_KV_CACHE_MB = 1024


class Sampler(Protocol):
    """What an episode samples its turns from: this module's BatchedSampler (the local
    engine) or `agentrft.engine.vllm_client.VLLMSampler`. Token ids in; a Completion (the
    sampled ids and their log-probs) out."""

    params: SamplingParams

    async def sample(
        self,
        tokens: Sequence[int],
        max_new: int,
        seed: int | None = None,
        params: SamplingParams | None = None,
        key: Hashable | None = None,
    ) -> Completion: ...

    def release(self, key: Hashable) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    async def aclose(self) -> None: ...


@dataclass
class SamplerStats:
    batches: int = 0
    rows: int = 0
    sampled_tokens: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


class BatchedSampler:
    def __init__(
        self,
        policy: Policy,
        params: SamplingParams,
        max_batch: int = 32,
        gather_s: float = 0.002,
        kv_cache_mb: int = DEFAULT_KV_CACHE_MB,
    ) -> None:
        self.policy = policy
        self.params = params
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.stats = SamplerStats()
        # only policies that declare it take a cache (HFPolicy); with 0 MiB it just counts prefill tokens
        self.kv_cache = (
            PrefixCache(kv_cache_mb << 20) if getattr(policy, "keeps_kv_cache", False) else None
        )
        self._queue: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def sample(
        self,
        tokens: Sequence[int],
        max_new: int,
        seed: int | None = None,
        params: SamplingParams | None = None,
        key: Hashable | None = None,
    ) -> Completion:
        """Queue one prompt; `seed` fixes this request's random stream (see Policy.sample);
        `params` replaces the sampler's own for this request; `key` (a rollout's trace id)
        keeps its KV cache for its next turn, until `release(key)`."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._run())
        fut: asyncio.Future[Completion] = loop.create_future()
        self._queue.append((tokens, max_new, seed, params, key, fut))
        assert self._wake is not None
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.gather_s)  # let rollouts released in the same tick join
            self._wake.clear()
            while self._queue:
                batch = self._take_batch()
                seeded = [b[2] for b in batch if b[2] is not None]
                row_seeds = (
                    seeded if len(seeded) == len(batch) else None
                )  # unseeded: the policy seeds the batch
                params = batch[0][3] or self.params
                t0 = time.perf_counter()
                prompts, limits = [b[0] for b in batch], [b[1] for b in batch]
                try:
                    if self.kv_cache is not None:
                        out = await on_caller(
                            self.policy.sample,
                            prompts,
                            params,
                            limits,
                            row_seeds,
                            cache=self.kv_cache,
                            cache_keys=[b[4] for b in batch],
                        )  # type: ignore[call-arg]  # keeps_kv_cache says it takes them
                    else:
                        out = await on_caller(
                            self.policy.sample, prompts, params, limits, row_seeds
                        )
                except asyncio.CancelledError:
                    for *_, fut in batch:
                        fut.cancel()
                    raise
                except Exception as exc:  # a sampling failure fails the waiting rollouts, loudly
                    for *_, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.stats.busy_s += time.perf_counter() - t0
                self.stats.batches += 1
                self.stats.rows += len(batch)
                self.stats.batch_sizes.append(len(batch))
                for (*_, fut), completion in zip(batch, out, strict=True):
                    self.stats.sampled_tokens += len(completion.tokens)
                    if not fut.done():
                        fut.set_result(completion)

    def _take_batch(self) -> list[_Request]:
        """Up to max_batch queued requests like the oldest one: equal params, and seeded
        only with seeded ones."""
        key = (self._queue[0][3], self._queue[0][2] is None)
        batch = [q for q in self._queue if (q[3], q[2] is None) == key][: self.max_batch]
        taken = {id(q) for q in batch}
        self._queue = [q for q in self._queue if id(q) not in taken]
        return batch

    def metrics(self) -> dict[str, float]:
        """The `sampler/*` entries of a training step's metrics."""
        out = {
            "sampler/batches": float(self.stats.batches),
            "sampler/mean_batch": self.stats.rows / max(1, self.stats.batches),
            "sampler/busy_s": self.stats.busy_s,  # wall time in batched sampling calls
        }
        if self.kv_cache is not None:
            out["sampler/prefill_tokens"] = float(self.kv_cache.stats.prefill_tokens)
            out["sampler/reused_tokens"] = float(
                self.kv_cache.stats.reused_tokens
            )  # kept from earlier turns
        return out

    def release(self, key: Hashable) -> None:
        """The rollout `key` has ended: drop its kept KV cache."""
        if self.kv_cache is not None:
            self.kv_cache.release(key)

    async def aclose(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.clear()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
            self._worker = None
