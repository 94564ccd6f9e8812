"""BatchedSampler: concurrent requests share a batch only when their sampling params match."""

from __future__ import annotations

import asyncio

from agentrft.policy import SamplingParams
from agentrft.rollout.batching import BatchedSampler
from tests.scripted import ScriptedPolicy


def test_requests_batch_by_params() -> None:
    policy = ScriptedPolicy(["ok"], delay_s=0.05)
    sampler = BatchedSampler(policy, SamplingParams(seed=100, max_tokens=8), max_batch=3)
    hot, cold = SamplingParams(temperature=1.0, max_tokens=8), SamplingParams(temperature=0.0, max_tokens=8)

    async def run() -> None:
        prompt = policy.tokenizer.encode("hi")
        waves = [None, hot, cold, hot, None, hot, hot, None]  # arrival order
        out = await asyncio.gather(*(sampler.sample(prompt, 8, p) for p in waves))
        assert all(c.finish_reason == "stop" for c in out)
        await sampler.aclose()

    asyncio.run(run())
    batches = [(rows, params) for rows, params in policy.calls]
    # one batch per params, oldest first; max_batch splits the four `hot` requests
    assert [(rows, p.temperature, p.seed) for rows, p in batches] == [(3, 1.0, 100), (3, 1.0, None), (1, 0.0, None), (1, 1.0, None)]
    assert sampler.stats.batch_sizes == [3, 3, 1, 1] and sampler.stats.rows == 8


def test_default_params_advance_the_seed_per_batch() -> None:
    policy = ScriptedPolicy(["ok"])
    sampler = BatchedSampler(policy, SamplingParams(seed=7, max_tokens=8))

    async def run() -> None:
        for _ in range(3):
            await sampler.sample(policy.tokenizer.encode("hi"), 4)
        await sampler.aclose()

    asyncio.run(run())
    assert [p.seed for _, p in policy.calls] == [7, 8, 9]
