"""Batch generation across every rollout currently waiting for the model.

Episodes `await sampler.sample(tokens, max_new)`. Requests queue up while the model is busy
(or while other rollouts wait on tools); the worker then takes everything queued and runs
one batched `policy.sample` in a thread, so HTTP tool calls keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        self._queue: list[tuple[Sequence[int], int, int | None, asyncio.Future[Completion]]] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def sample(self, tokens: Sequence[int], max_new: int, seed: int | None = None) -> Completion:
        """Queue one prompt; `seed` fixes this request's random stream (see Policy.sample)."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._run())
        fut: asyncio.Future[Completion] = loop.create_future()
        self._queue.append((tokens, max_new, seed, fut))
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
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
                seeds = [b[2] for b in batch]
                row_seeds = None if any(s is None for s in seeds) else seeds
                t0 = time.perf_counter()
                try:
                    out = await asyncio.to_thread(self.policy.sample, [b[0] for b in batch], self.params, [b[1] for b in batch], row_seeds)
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

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
            self._worker = None
