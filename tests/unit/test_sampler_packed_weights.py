"""The sampler's matmuls on weights prepacked for oneDNN (`policy.precision.PackedLinears`):
the same results as plain Linear layers, a weight changed after packing is packed again,
and nothing changes outside the sampler (gradients, `generate`, scoring)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentrft.policy import SamplingParams
from agentrft.policy.precision import PackableLinear, PackedLinears
from tests.unit.tiny_models import onednn_packs

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def mlp(dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8, bias=False)
    ).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_give_the_plain_result(dtype: torch.dtype) -> None:
    if not onednn_packs(dtype):
        pytest.skip(f"this CPU's oneDNN cannot prepack {dtype} weights")
    model = mlp(dtype)
    x = torch.randn(16, 32).to(dtype)
    with torch.no_grad():
        plain = model(x)
        packs = PackedLinears(model)
        with packs.active():
            packed = model(x)
    assert all(type(m) is PackableLinear for m in (model[0], model[2]))
    assert len(packs._packed) == 2  # both layers really ran on packed weights
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(packed.float(), plain.float(), rtol=tol, atol=tol)


def test_a_weight_changed_after_packing_is_packed_again() -> None:
    model = mlp()
    packs = PackedLinears(model)
    x = torch.randn(4, 32)
    with torch.no_grad():
        with packs.active():
            model(x)  # packs both weights
        model[2].weight.mul_(-1)  # an in-place update, as sync_sampler's copy_ is
        with packs.active():
            updated = model(x)
        assert torch.allclose(updated, model(x), atol=1e-5)
        model[0].weight = torch.nn.Parameter(model[0].weight * 2)  # a replaced weight
        with packs.active():
            replaced = model(x)
        assert torch.allclose(replaced, model(x), atol=1e-5)
        assert not torch.allclose(replaced, updated, atol=1e-3)


def test_outside_the_sampler_the_layers_are_plain_linear() -> None:
    model = mlp()
    packs = PackedLinears(model)
    x = torch.randn(4, 32)
    model(x).sum().backward()  # gradients flow outside `active()`
    assert model[0].weight.grad is not None
    with packs.active():
        model(x).sum().backward()  # and inside it, where gradients are wanted
    assert not packs._packed  # the packed path never ran


def tiny_policy(tokenizer: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrft.policy.hf import HFPolicy

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return HFPolicy(LlamaForCausalLM(config).eval(), tokenizer, dtype="fp32")


def test_sampling_on_packed_weights_matches_plain_weights(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentrft.policy.precision._PACKING", {})
    monkeypatch.setattr("agentrft.policy.precision.packing_speedup", lambda dtype: 2.0)
    policy = tiny_policy(tokenizer)
    prompts = [tokenizer.encode("Tell me a story.")] * 3 + [tokenizer.encode("Hi")]
    params = SamplingParams(temperature=1.0, max_tokens=12)
    policy.pack_linears = False
    plain = policy.sample(prompts, params, seeds=[1, 2, 3, 4])
    assert policy._packs is None
    policy.pack_linears = True
    packed = policy.sample(prompts, params, seeds=[1, 2, 3, 4])
    assert policy._packs is not None and policy._packs._packed
    assert [c.tokens for c in packed] == [c.tokens for c in plain]
    for a, b in zip(packed, plain, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_packing_is_skipped_where_it_does_not_pay(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentrft.policy.precision._PACKING", {})
    monkeypatch.setattr("agentrft.policy.precision.packing_speedup", lambda dtype: 0.9)
    policy = tiny_policy(tokenizer)
    policy.sample([tokenizer.encode("Hi")], SamplingParams(max_tokens=2), seeds=[0])
    assert policy._packs is None and policy.pack_linears is False
    assert not any(type(m) is PackableLinear for m in policy.model.modules())


def test_the_packing_choice_is_set_by_hand_pinned_over_that_and_refuses_typos(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrft.errors import ConfigError
    from agentrft.policy import precision

    monkeypatch.setattr(precision, "_PACKING", {})
    monkeypatch.setattr(precision, "packing_speedup", lambda dtype: 5.0)
    monkeypatch.setenv(precision.PACKING_ENV, "off")
    assert precision.use_packing(torch.float32) is False  # by hand, over the measurement
    assert precision.packing_choices() == {"float32": False}
    monkeypatch.setattr(precision, "_PACKING", {})
    precision.pin_packing({"float32": True})  # a resumed run's checkpoint, over the env
    assert precision.use_packing(torch.float32) is (
        precision._packing_sample(torch.float32) is not None
    )
    monkeypatch.setattr(precision, "_PACKING", {})
    monkeypatch.setenv(precision.PACKING_ENV, "yes")
    with pytest.raises(ConfigError, match="AGENTRFT_PACKED_MATMULS='yes': use on or off"):
        precision.use_packing(torch.float32)
