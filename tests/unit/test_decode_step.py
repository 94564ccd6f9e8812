"""`policy.decode.LlamaDecodeStep`: a decode step with fused weights gives what transformers'
own forward gives (logits and the keys and values it appends), with padded rows, with a
shared prefix, in fp32 and bf16, on plain and prepacked weights; it follows weights changed
after it ran; it declines models it does not compute exactly; sampling through it draws the
same tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from agentrft.policy import SamplingParams
from agentrft.policy.decode import LlamaDecodeStep
from agentrft.policy.hf import HFPolicy
from agentrft.policy.prefill import SharedPrefix, prefill_prompts, shared_prefix
from tests.unit.tiny_models import onednn_packs, tiny_llama


def policy_of(model: LlamaForCausalLM, tokenizer: Any, dtype: str) -> HFPolicy:
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    return HFPolicy(model, tokenizer, dtype=dtype)


def run_both(
    policy: HFPolicy, prompts: list[list[int]], steps: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], Any, Any]:
    """Prefill twice, then decode `steps` tokens per row through transformers on one cache
    and through the decode step on the other, feeding both the same tokens."""
    step = policy.decode_step
    assert step is not None
    policy.decode_step = None
    try:
        dev = torch.device("cpu")
        a = prefill_prompts(policy.forward_last, prompts, policy.pad_token_id, dev, steps)
        b = prefill_prompts(policy.forward_last, prompts, policy.pad_token_id, dev, steps)
        shared = SharedPrefix.of(list(a.prompt_of), a.shared_width)
        mask, pos, tok = a.mask, a.last_pos, a.logits.argmax(-1)
        ref, ours = [], []
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype)], dim=1)
            pos = pos + 1
            with shared_prefix(shared):
                ref.append(policy.forward_last(tok[:, None], mask, pos, a.cache).float())
                ours.append(step(tok[:, None], mask, pos, b.cache).float())
            tok = ref[-1].argmax(-1)
        return ref, ours, a.cache, b.cache
    finally:
        policy.decode_step = step


PROMPTS = {
    "padded": [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]],  # rows of other lengths
    "shared": [[5, 6, 7, 8, 9]] * 3 + [[20, 21, 22]] * 2,  # two groups, read once each
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("layout", ["padded", "shared"])
def test_decode_steps_equal_transformers_forward(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, dtype: str, packed: bool, layout: str
) -> None:
    if packed and not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    if packed and dtype == "bf16" and not onednn_packs(torch.bfloat16):
        pytest.skip(
            "this CPU's oneDNN cannot prepack bf16 weights (needs avx512bw/vl/dq or avx_ne_convert)"
        )
    # prepack whatever this CPU measures, so both paths are covered everywhere
    monkeypatch.setattr("agentrft.policy.precision._PACKING", {})
    monkeypatch.setenv("AGENTRFT_PACKED_MATMULS", "on" if packed else "off")
    policy = policy_of(tiny_llama(), tokenizer, dtype)
    ref, ours, ref_cache, our_cache = run_both(policy, PROMPTS[layout], steps=5)
    assert policy.decode_step is not None and policy.decode_step._packed is packed
    tol = 1e-4 if dtype == "fp32" else 3e-2
    for r, o in zip(ref, ours, strict=True):
        assert o.shape == r.shape
        assert torch.allclose(o.log_softmax(-1), r.log_softmax(-1), atol=tol, rtol=0)
    for r_layer, o_layer in zip(ref_cache.layers, our_cache.layers, strict=True):
        assert torch.allclose(o_layer.keys.float(), r_layer.keys.float(), atol=tol)
        assert torch.allclose(o_layer.values.float(), r_layer.values.float(), atol=tol)


def test_a_weight_changed_after_a_step_is_used_at_the_next(tokenizer: Any) -> None:
    model = tiny_llama()
    policy = policy_of(model, tokenizer, "fp32")
    before = run_both(policy, PROMPTS["padded"], steps=2)[1]
    with torch.no_grad():  # in place, as sync_sampler's copy_ is
        model.model.layers[1].mlp.down_proj.weight.mul_(-3)
        model.model.layers[0].self_attn.k_proj.weight.add_(0.5)
        model.model.layers[1].input_layernorm.weight.mul_(2.0)  # folded into q, k, v
    ref, ours, _, _ = run_both(policy, PROMPTS["padded"], steps=2)
    assert not torch.allclose(ours[0], before[0], atol=1e-3)
    assert all(torch.allclose(o, r, atol=1e-4) for o, r in zip(ours, ref, strict=True))


def test_models_it_does_not_compute_exactly_keep_transformers_forward(tokenizer: Any) -> None:
    assert LlamaDecodeStep.supports(tiny_llama())
    assert not LlamaDecodeStep.supports(tiny_llama(attention_bias=True))
    assert not LlamaDecodeStep.supports(tiny_llama(mlp_bias=True))
    assert not LlamaDecodeStep.supports(tiny_llama(hidden_act="gelu"))
    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert not LlamaDecodeStep.supports(adapted.get_base_model())  # q_proj adds its delta
    with pytest.raises(ValueError, match="not a bias-free Llama"):
        LlamaDecodeStep(tiny_llama(attention_bias=True))
    assert HFPolicy(tiny_llama(attention_bias=True), tokenizer).decode_step is None


def test_sampling_through_the_decode_step_draws_the_same_tokens(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_of(tiny_llama(vocab=len(tokenizer)), tokenizer, "fp32")
    story, hi = tokenizer.encode("Tell me a story."), tokenizer.encode("Hi")
    prompts = [story, hi, story, story]
    params = SamplingParams(temperature=1.0, max_tokens=8)
    limits = [3, 8, 8, 5]  # rows leave the batch as they go
    assert policy.decode_step is not None
    calls = 0
    real = LlamaDecodeStep.__call__

    def counted(self: LlamaDecodeStep, *args: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return real(self, *args)

    monkeypatch.setattr(LlamaDecodeStep, "__call__", counted)
    ours = policy.sample(prompts, params, max_tokens=limits, seeds=[1, 2, 3, 4])
    step, policy.decode_step = policy.decode_step, None
    ref = policy.sample(prompts, params, max_tokens=limits, seeds=[1, 2, 3, 4])
    policy.decode_step = step
    assert calls == 7  # every decode step but the first token's (from the prefill)
    assert [c.tokens for c in ours] == [c.tokens for c in ref]
    for a, b in zip(ours, ref, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
