"""KV-cache re-use across turns on the real model: a rollout's next turn, prefilled only from
its kept prefix, samples the same tokens with the same log-probs (fp32 tolerance) as a full
re-prefill of its whole context."""

from __future__ import annotations

from typing import Any

import pytest

from agentrft.policy import SamplingParams
from agentrft.policy.kv_cache import PrefixCache

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    from agentrft.policy.hf import HFPolicy

    return HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype="fp32")


def chat(tok: Any, text: str) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tok.encode(text, add_special_tokens=False))


def tool_turn(tok: Any, output: str) -> list[int]:
    return list(
        tok.encode(
            f"<|im_end|>\n<|im_start|>tool\n{output}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
    )


def test_next_turn_from_the_kept_prefix_matches_a_full_prefill(policy: Any) -> None:
    tok = policy.tokenizer
    long = chat(tok, "List the files you would open to fix a failing login test. " * 6)
    short = chat(tok, "Say hi.")
    params = SamplingParams(temperature=1.0, max_tokens=12)
    cache = PrefixCache(1 << 30, memory_available=lambda: None)

    # turn 1: two rollouts share the long prompt (prefilled once), one has the short one
    first = policy.sample(
        [long, long, short], params, seeds=[1, 2, 3], cache=cache, cache_keys=["a", "b", "c"]
    )
    assert len(cache) == 3 and cache.stats.prefill_tokens == len(long) + len(short)
    # turn 2: each rollout's context grows by its reply and a tool output of its own length;
    # a new rollout with a fresh prompt joins the batch
    outputs = ["src/auth/login.py\nsrc/auth/session.py", "no matches", "README.md " * 8]
    nxt = [
        p + list(c.tokens) + tool_turn(tok, o)
        for p, c, o in zip([long, long, short], first, outputs, strict=True)
    ]
    fresh = chat(tok, "What is 2 + 2?")
    prompts = [*nxt, fresh]
    kept = sum(len(p) + len(c.tokens) - 1 for p, c in zip([long, long, short], first, strict=True))

    before = cache.stats.prefill_tokens
    reused = policy.sample(
        prompts, params, seeds=[4, 5, 6, 7], cache=cache, cache_keys=["a", "b", "c", "d"]
    )
    full = policy.sample(prompts, params, seeds=[4, 5, 6, 7])

    assert cache.stats.reused_tokens == kept
    assert cache.stats.prefill_tokens - before == sum(len(p) for p in prompts) - kept
    for r, f in zip(reused, full, strict=True):
        assert r.tokens == f.tokens
        assert r.logprobs == pytest.approx(f.logprobs, abs=2e-4)
    # every keyed row kept its cache for a third turn
    assert len(cache) == 4


def test_a_context_that_does_not_extend_the_kept_prefix_is_prefilled_in_full(policy: Any) -> None:
    tok = policy.tokenizer
    prompt = chat(tok, "Name a colour.")
    params = SamplingParams(temperature=0.0, max_tokens=6)
    cache = PrefixCache(1 << 30, memory_available=lambda: None)
    policy.sample([prompt], params, cache=cache, cache_keys=["a"])
    other = chat(tok, "Name a fruit.")
    before = cache.stats.prefill_tokens
    out = policy.sample([other], params, cache=cache, cache_keys=["a"])
    assert cache.stats.prefill_tokens - before == len(other) and out == policy.sample(
        [other], params
    )
