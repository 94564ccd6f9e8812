"""The store of KV caches kept between a rollout's turns: prefix checks, the memory bound,
and the episode's side (its trace id keys every turn; the end of the rollout releases it)."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from agentrft.policy import SamplingParams
from agentrft.policy.kv_cache import CachedPrefix, PrefixCache
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import run_groups_async
from agentrft.tools import build_tools
from agentrft.types import Item
from tests.conftest import ScriptedPolicy
from tests.unit.test_rollout_engine import SPECS, call


def entry(tokens: list[int], layers: int = 2) -> CachedPrefix:
    """1 head x len x 4 dims per layer, fp32: 32 bytes per token per layer."""
    kv = tuple(
        (torch.zeros(1, len(tokens), 4), torch.zeros(1, len(tokens), 4)) for _ in range(layers)
    )
    return CachedPrefix(tuple(tokens), kv)


def test_take_returns_a_kept_strict_prefix_once() -> None:
    cache = PrefixCache(1 << 20, memory_available=lambda: None)
    assert cache.put("a", entry([1, 2, 3]))
    assert cache.take("a", [1, 2, 3, 4, 5]) is not None
    assert cache.take("a", [1, 2, 3, 4, 5]) is None  # taken: the turn will keep a longer one
    cache.put("a", entry([1, 2, 3]))
    assert cache.take("a", [1, 2, 9, 4]) is None and len(cache) == 0  # not a prefix: dropped
    cache.put("a", entry([1, 2, 3]))
    assert cache.take("a", [1, 2, 3]) is None  # nothing left to prefill: the full path runs
    assert cache.take("missing", [1]) is None


def test_the_memory_bound_evicts_the_oldest_first() -> None:
    size = entry([1, 2, 3]).nbytes
    assert size == 3 * 2 * 2 * 4 * 4
    cache = PrefixCache(2 * size, memory_available=lambda: None)
    for key in "abc":
        assert cache.put(key, entry([1, 2, 3]))
    assert cache.nbytes == 2 * size and cache.stats.evicted == 1
    assert cache.take("a", [1, 2, 3, 4]) is None and cache.take("c", [1, 2, 3, 4]) is not None
    assert not cache.put("big", entry(list(range(10))))  # larger than the whole bound
    assert cache.stats.refused == 1 and cache.stats.peak_bytes == 2 * size


def test_nothing_is_kept_when_memory_is_short_or_reuse_is_off() -> None:
    free = [10 << 30]
    cache = PrefixCache(1 << 30, min_available=1 << 30, memory_available=lambda: free[0])
    assert cache.put("a", entry([1, 2]))
    free[0] = 512 << 20
    assert not cache.put("a", entry([1, 2, 3]))  # and the older entry of "a" is gone too
    assert len(cache) == 0 and cache.stats.refused == 1
    off = PrefixCache(0)
    assert not off.put("a", entry([1])) and len(off) == 0


class KeyedPolicy(ScriptedPolicy):
    """A scripted policy that takes a KV-cache store, as HFPolicy does: it records each
    row's key and keeps a dummy entry per keyed row."""

    keeps_kv_cache = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys: list[list[Any]] = []

    def sample(self, prompts, params, max_tokens=None, seeds=None, cache=None, cache_keys=None):  # type: ignore[no-untyped-def]
        assert cache is not None and cache_keys is not None
        self.keys.append(list(cache_keys))
        out = super().sample(prompts, params, max_tokens, seeds)
        for key, p in zip(cache_keys, prompts, strict=True):
            cache.put(key, entry(list(p)))
        return out


def test_an_episode_keys_every_turn_with_its_trace_id_and_releases_it(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, SPECS, system_prompt="You add numbers.")
    settings = RolloutSettings(
        renderer=renderer, tools=build_tools(SPECS, timeout_s=5, retries=0, backoff_s=0)
    )
    policy = KeyedPolicy(tokenizer, [call(2, 3), call(5, 4), "The answer is 9."])
    sampler = BatchedSampler(policy, SamplingParams(max_tokens=200))
    assert sampler.kv_cache is not None
    released: list[Any] = []
    release = sampler.kv_cache.release
    sampler.kv_cache.release = lambda key: (released.append(key), release(key))[1]  # type: ignore[method-assign]
    items = [Item(0, ({"role": "user", "content": "What is 2 + 3, then + 4?"},), {}, "t:0")]
    (group,) = asyncio.run(run_groups_async(items, 2, settings, sampler))
    traces = {t.trace_id for t in group.trajectories}
    assert all(len(t.turns) == 3 for t in group.trajectories)
    assert {k for keys in policy.keys for k in keys} == traces and sum(map(len, policy.keys)) == 6
    assert sorted(released) == sorted(traces)
    assert {"sampler/prefill_tokens", "sampler/reused_tokens", "sampler/batches"} <= set(
        sampler.metrics()
    )


def test_policies_without_a_kv_cache_are_called_as_before(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["ok"])
    assert BatchedSampler(policy, SamplingParams()).kv_cache is None


def test_the_job_sets_the_bound(tokenizer: Any) -> None:
    from agentrft.job import job_from_dict
    from agentrft.runtime import batched_sampler

    grader = {
        "type": "string_check",
        "name": "g",
        "input": "{{sample.output_text}}",
        "reference": "x",
        "operation": "eq",
    }
    base = {
        "training_file": "t.jsonl",
        "method": {"type": "reinforcement", "reinforcement": {"grader": grader}},
    }
    policy = KeyedPolicy(tokenizer, ["ok"])
    default = batched_sampler(job_from_dict(base), policy, SamplingParams())
    off = batched_sampler(
        job_from_dict({**base, "agentrft": {"sampling": {"kv_cache_mb": 0, "max_batch": 4}}}),
        policy,
        SamplingParams(),
    )
    assert default.kv_cache is not None and default.kv_cache.max_bytes == 1024 << 20
    assert off.kv_cache is not None and off.kv_cache.max_bytes == 0 and off.max_batch == 4


def test_a_growing_layer_holds_what_a_dynamic_layer_holds() -> None:
    from transformers.cache_utils import DynamicLayer

    from agentrft.policy.prefill import GrowingLayer

    grown, plain = GrowingLayer(reserve=2), DynamicLayer()
    steps = [
        torch.randn(3, 2, n, 4) for n in (5, 1, 1, 1, 1)
    ]  # a prefill, then decode steps past the reserve
    for k in steps:
        a, b = grown.update(k, -k), plain.update(k, -k)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    rows = torch.tensor([2, 0])
    grown.batch_select_indices(rows)
    plain.batch_select_indices(rows)
    assert torch.equal(grown.keys, plain.keys) and grown.get_seq_length() == 9
    nxt = torch.randn(2, 2, 1, 4)
    assert torch.equal(grown.update(nxt, nxt)[0], plain.update(nxt, nxt)[0])
