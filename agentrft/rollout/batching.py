"""Batch generation across every rollout currently waiting for the model.

Episodes `await sampler.sample(tokens, max_new)`. Requests queue up while the model is busy
(or while other rollouts wait on tools); the worker then takes everything queued and runs
one batched `policy.sample` in a thread, so HTTP tool calls keep running meanwhile.

A request may bring its own SamplingParams (the chat server does: each HTTP request has its
own temperature, stop strings, seed); requests are batched with others that share the
same params, in arrival order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrft.policy import Completion, Policy, SamplingParams


@dataclass
class SamplerStats:
    batches: int = 0
    rows: int = 0
    sampled_tokens: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


class BatchedSampler:
    def __init__(self, policy: Policy, params: SamplingParams, max_batch: int = 32, gather_s: float = 0.002) -> None:
        self.policy = policy
        self.params = params
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.stats = SamplerStats()
        self._queue: list[tuple[Sequence[int], int, SamplingParams | None, asyncio.Future[Completion]]] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._seed = params.seed

    async def sample(self, tokens: Sequence[int], max_new: int, params: SamplingParams | None = None) -> Completion:
        """Continue `tokens` by at most `max_new` tokens, batched with concurrent callers.
        `params` defaults to the sampler's own (whose seed advances per batch)."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._run())
        fut: asyncio.Future[Completion] = loop.create_future()
        self._queue.append((tokens, max_new, params, fut))
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
                params = batch[0][2]
                if params is None:
                    params = self.params
                    if self._seed is not None:  # a new, reproducible seed per batch
                        params = dataclasses.replace(params, seed=self._seed + self.stats.batches)
                t0 = time.perf_counter()
                try:
                    out = await asyncio.to_thread(self.policy.sample, [b[0] for b in batch], params, [b[1] for b in batch])
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

    def _take_batch(self) -> list[tuple[Sequence[int], int, SamplingParams | None, asyncio.Future[Completion]]]:
        """Up to max_batch queued requests that share the oldest request's params."""
        key = self._queue[0][2]
        batch = [q for q in self._queue if q[2] == key][: self.max_batch]
        taken = {id(q) for q in batch}
        self._queue = [q for q in self._queue if id(q) not in taken]
        return batch

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None
