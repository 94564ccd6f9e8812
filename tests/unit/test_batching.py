"""BatchedSampler: concurrent requests share a batch only when their sampling params match,
and seeded requests are never batched with unseeded ones (whose batch gets no row seeds)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrft.policy import Completion, SamplingParams
from agentrft.rollout.batching import BatchedSampler
from tests.conftest import ScriptedPolicy


def run_all(
    sampler: BatchedSampler,
    prompt: list[int],
    requests: list[tuple[int | None, SamplingParams | None]],
) -> list[Completion]:
    async def go() -> list[Completion]:
        try:
            return await asyncio.gather(
                *(sampler.sample(prompt, 8, seed, params) for seed, params in requests)
            )
        finally:
            await sampler.aclose()

    return asyncio.run(go())


def test_requests_batch_by_params(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["ok"], delay_s=0.05)
    own = SamplingParams(temperature=0.7, max_tokens=8)
    sampler = BatchedSampler(policy, own, max_batch=3)
    hot, cold = (
        SamplingParams(temperature=1.0, max_tokens=8),
        SamplingParams(temperature=0.0, max_tokens=8),
    )
    arrivals = [None, hot, cold, hot, None, hot, hot, None]
    out = run_all(sampler, tokenizer.encode("hi"), [(None, p) for p in arrivals])
    assert all(c.finish_reason == "stop" for c in out)
    # one batch per params, oldest first; max_batch splits the four `hot` requests
    assert [(rows, params) for rows, params, _ in policy.calls] == [
        (3, own),
        (3, hot),
        (1, cold),
        (1, hot),
    ]
    assert sampler.stats.batch_sizes == [3, 3, 1, 1] and sampler.stats.rows == 8


def test_seeded_requests_keep_their_seeds(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["ok"], delay_s=0.05)
    sampler = BatchedSampler(policy, SamplingParams(max_tokens=8))
    run_all(sampler, tokenizer.encode("hi"), [(None, None), (5, None), (None, None), (6, None)])
    assert [(rows, seeds) for rows, _, seeds in policy.calls] == [(2, None), (2, (5, 6))]
