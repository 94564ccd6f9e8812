"""`prefill.decode_attention`: a decode step's grouped queries packed onto their key/value
heads, and a prefix shared by several rows read once, give what transformers' own sdpa
attention gives; a model switched to it gives the same logits and samples the same tokens."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentrft.policy.prefill import (
    DECODE_ATTENTION,
    SharedPrefix,
    decode_attention,
    shared_prefix,
    use_decode_attention,
)
from tests.unit.tiny_models import tiny_llama


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_mask", [False, True])
def test_decode_attention_equals_sdpa(dtype: torch.dtype, with_mask: bool) -> None:
    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    rows, kv_heads, length, dim = 4, 2, 37, 16
    query = torch.randn(rows, kv_heads * 3, 1, dim).to(dtype)
    key = torch.randn(rows, kv_heads, length, dim).to(dtype)
    value = torch.randn(rows, kv_heads, length, dim).to(dtype)
    mask = None
    if with_mask:  # a padded row, as rows with different prompts have
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        mask[1, ..., :5] = False
    ours, _ = decode_attention(module, query, key, value, mask, scaling=dim**-0.5)  # type: ignore[arg-type]
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim**-0.5)  # type: ignore[arg-type]
    assert ours.shape == ref.shape == (rows, 1, kv_heads * 3, dim)
    assert torch.allclose(ours.float(), ref.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_a_model_on_decode_attention_gives_the_same_logits() -> None:
    model = tiny_llama()
    ids = torch.randint(0, 100, (3, 9))

    def decode_logits() -> torch.Tensor:  # a prefill, then one decode step on the cache
        with torch.no_grad():
            out = model(input_ids=ids[:, :-1], use_cache=True)
            return model(input_ids=ids[:, -1:], cache=out.past_key_values).logits

    ref = decode_logits()
    use_decode_attention(model)
    assert model.config._attn_implementation == DECODE_ATTENTION
    assert torch.allclose(decode_logits(), ref, atol=1e-5)


def test_shared_prefix_groups() -> None:
    shared = SharedPrefix.of(["a", None, "a", "b", "a", "b", "c"], width=7)
    assert shared is not None and shared.width == 7
    assert [g.tolist() for g in shared.groups] == [[0, 2, 4], [3, 5]]
    assert shared.alone.tolist() == [1, 6]
    assert SharedPrefix.of(["a", "b", None], width=7) is None  # nothing shared: plain attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("layout", ["groups and a lone row", "one group of every row"])
def test_reading_a_shared_prefix_once_equals_reading_every_row(
    dtype: torch.dtype, with_mask: bool, layout: str
) -> None:
    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    rows, kv_heads, width, length, dim = 6, 2, 12, 17, 16
    query = torch.randn(rows, kv_heads * 3, 1, dim).to(dtype)
    key = torch.randn(rows, kv_heads, length, dim).to(dtype)
    value = torch.randn(rows, kv_heads, length, dim).to(dtype)
    if layout == "one group of every row":  # a GRPO group's first turn
        prompt_of: list[str | None] = ["p"] * rows
        copies = [(row, 0) for row in range(1, rows)]
    else:
        prompt_of = ["p", None, "p", "q", "p", "q"]
        copies = [(2, 0), (4, 0), (5, 3)]
    for row, first in copies:  # rows sharing a prompt: equal first columns
        key[row, :, :width] = key[first, :, :width]
        value[row, :, :width] = value[first, :, :width]
    mask = None
    if with_mask and layout == "one group of every row":  # the prompt's own padding
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        mask[..., :2] = False
    elif with_mask:  # padding at the start of each group's prompt and of the lone row's
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        mask[[0, 2, 4], ..., :3] = False
        mask[1, ..., :5] = False
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim**-0.5)  # type: ignore[arg-type]
    with shared_prefix(SharedPrefix.of(prompt_of, width)):
        ours, _ = decode_attention(module, query, key, value, mask, scaling=dim**-0.5)  # type: ignore[arg-type]
    assert ours.shape == ref.shape
    assert torch.allclose(ours.float(), ref.float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_sampling_with_shared_prompts_matches_reading_every_row(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrft.policy import SamplingParams
    from agentrft.policy.hf import HFPolicy

    policy = HFPolicy(tiny_llama(vocab=len(tokenizer)), tokenizer, dtype="fp32")
    story, hi = tokenizer.encode("Tell me a story."), tokenizer.encode("Hi")
    prompts = [story, hi, story, story, hi]  # two shared prompts of different lengths
    params = SamplingParams(temperature=1.0, max_tokens=10)
    limits = [3, 10, 6, 10, 10]  # rows leave the batch as they go
    calls: list[SharedPrefix | None] = []
    real_of = SharedPrefix.of

    def recorded(*args: Any) -> SharedPrefix | None:
        calls.append(real_of(*args))
        return calls[-1]

    monkeypatch.setattr(SharedPrefix, "of", staticmethod(recorded))
    shared = policy.sample(prompts, params, max_tokens=limits, seeds=[1, 2, 3, 4, 5])
    assert calls and calls[0] is not None and len(calls[0].groups) == 2
    monkeypatch.setattr(SharedPrefix, "of", staticmethod(lambda *args: None))
    every_row = policy.sample(prompts, params, max_tokens=limits, seeds=[1, 2, 3, 4, 5])
    assert [c.tokens for c in shared] == [c.tokens for c in every_row]
    for a, b in zip(shared, every_row, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
