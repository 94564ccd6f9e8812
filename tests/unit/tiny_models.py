"""A tiny randomly initialised Llama (2 layers, grouped-query heads, sdpa attention) for
tests of the sampler's attention and decode step: fast, and the same architecture as
SmolLM2."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 100, **overrides: Any) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        attn_implementation="sdpa",
        **overrides,
    )
    return LlamaForCausalLM(config).eval()


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN can prepack a `dtype` linear weight (bf16 needs avx512bw/vl/dq
    or avx_ne_convert; agentrft then does not pack, see policy.precision.use_packing)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 4)
    except RuntimeError:
        return False
    return True
