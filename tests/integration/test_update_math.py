"""The update's tensor paths on the real model: scoring a group through its shared prompt
gives the same log-probs and the same gradients as scoring every rollout in full."""

from __future__ import annotations

import pytest
import torch

from agentrft.job import Train
from agentrft.policy.hf import HFPolicy
from agentrft.train.checkpoint import make_trainable
from agentrft.train.update import Scored, micro_batches, shared_prefix, token_logprobs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model():
    policy = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype="fp32", for_training=True)
    m = make_trainable(policy.model, Train(), seed=0)
    with torch.no_grad():  # move LoRA B off zero so the adapter matters
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    return m, policy


def group(policy, n=4):
    tok = policy.tokenizer
    prompt = tok(
        tok.apply_chat_template(
            [
                {"role": "system", "content": "Be brief. " * 12},
                {"role": "user", "content": "Name a color."},
            ],
            tokenize=False,
            add_generation_prompt=True,
        ),
        add_special_tokens=False,
    )["input_ids"]
    items = []
    for k in range(n):
        reply = tok.encode(
            ["Red.", "Blue is nice.", "Green, I think, or maybe teal.", "Yellow!"][k % 4],
            add_special_tokens=False,
        ) + [2]
        toks = prompt + reply
        items.append(
            Scored(
                toks,
                list(range(len(prompt), len(toks))),
                [0.0] * len(reply),
                advantage=float(k) - 1.5,
                group=0,
            )
        )
    return items


def test_shared_prefix_path_matches_the_full_path(model):
    m, policy = model
    items = group(policy)
    assert shared_prefix(items) >= 30
    shared, _ = token_logprobs(m, items, 1.0, bf16=False)
    full = torch.cat([token_logprobs(m, [it], 1.0, bf16=False)[0] for it in items])
    assert torch.allclose(shared, full, atol=1e-4), (shared - full).abs().max()

    def grads(loss_fn):
        m.zero_grad(set_to_none=True)
        loss_fn().backward()
        return {
            n: p.grad.clone()
            for n, p in m.named_parameters()
            if p.requires_grad and p.grad is not None
        }

    adv = torch.tensor([it.advantage for it in items for _ in it.targets])
    g_shared = grads(lambda: -(token_logprobs(m, items, 1.0, bf16=False)[0] * adv).sum())
    g_full = grads(
        lambda: (
            -(torch.cat([token_logprobs(m, [it], 1.0, bf16=False)[0] for it in items]) * adv).sum()
        )
    )
    assert g_shared.keys() == g_full.keys() and g_shared
    for n in g_shared:  # equal up to fp32 summation order
        rel = (g_shared[n] - g_full[n]).norm() / g_full[n].norm().clamp_min(1e-12)
        assert rel < 1e-3, (n, float(rel))


def test_micro_batches_keep_groups_together_and_respect_the_budget(model):
    _, policy = model
    a, b = group(policy), group(policy)
    b = [Scored(it.tokens, it.targets, it.sampler_logp, it.advantage, group=1) for it in b]
    items = a + b
    batches = micro_batches(items, max_tokens=10_000)
    assert sorted(len(x) for x in batches) == [4, 4]
    assert all(len({items[i].group for i in x}) == 1 for x in batches)
    p = shared_prefix(a)
    own = sorted((len(it.tokens) - p for it in a), reverse=True)  # each row's suffix, unpadded
    tight = micro_batches(items, max_tokens=p + own[0] + own[1])
    assert all(len(x) <= 2 for x in tight) and sum(len(x) for x in tight) == 8
    assert [len(x) for x in tight[:2]] == [2, 2]  # the two longest fit, a third does not
    # the budget counts each row's own length, not the longest one's: short rows pack more
    assert len(micro_batches(a, max_tokens=p + sum(own))) == 1
