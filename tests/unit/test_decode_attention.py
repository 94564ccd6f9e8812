"""`prefill.decode_attention`: a decode step's grouped queries packed onto their key/value
heads give what transformers' own sdpa attention gives, and a model switched to it samples
the same tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentrft.policy.prefill import DECODE_ATTENTION, decode_attention, use_decode_attention


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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 100, (3, 9))

    def decode_logits() -> torch.Tensor:  # a prefill, then one decode step on the cache
        with torch.no_grad():
            out = model(input_ids=ids[:, :-1], use_cache=True)
            return model(input_ids=ids[:, -1:], cache=out.past_key_values).logits

    ref = decode_logits()
    use_decode_attention(model)
    assert model.config._attn_implementation == DECODE_ATTENTION
    assert torch.allclose(decode_logits(), ref, atol=1e-5)
