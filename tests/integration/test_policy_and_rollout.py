"""The real 135M model: the sampling loop against transformers' own generate and forward
pass, and a real rollout against the quickstart environment server in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrft.policy import SamplingParams
from agentrft.policy.hf import HFPolicy
from agentrft.types import Origin, StopReason

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def policy():
    return HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype="fp32")


def prompts(policy, texts):
    tok = policy.tokenizer
    return [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
        for t in texts
    ]


def test_batched_greedy_sampling_matches_generate_row_by_row(policy):
    ps = prompts(
        policy, ["Name a fruit.", "What is the capital of France? Answer in a long sentence.", "Hi"]
    )
    out = policy.sample(ps, SamplingParams(temperature=0, max_tokens=24))
    for p, c in zip(ps, out, strict=True):
        ref = policy.model.generate(
            torch.tensor([p]),
            max_new_tokens=24,
            do_sample=False,
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
        )
        ref_new = ref[0, len(p) :].tolist()
        assert list(c.tokens) == ref_new[: len(c.tokens)]
        assert c.finish_reason == ("stop" if c.tokens[-1] in policy.stop_token_ids else "length")


def test_sampled_logprobs_match_a_teacher_forced_forward_pass(policy):
    ps = prompts(policy, ["Tell me a story about a cat.", "2+2="])
    out = policy.sample(ps, SamplingParams(temperature=0.8, max_tokens=16, seed=3))
    for p, c in zip(ps, out, strict=True):
        seq = torch.tensor([p + list(c.tokens)])
        with torch.no_grad():
            logits = policy.model(seq).logits[0, len(p) - 1 : -1].float() / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.tokens)[:, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(c.logprobs), atol=2e-3), (ref, c.logprobs)


def test_seed_makes_sampling_reproducible_and_limits_are_per_row(policy):
    ps = prompts(policy, ["Write a poem.", "Write a list."])
    a = policy.sample(
        ps, SamplingParams(temperature=1.0, max_tokens=12, seed=11), max_tokens=[5, 12]
    )
    b = policy.sample(
        ps, SamplingParams(temperature=1.0, max_tokens=12, seed=11), max_tokens=[5, 12]
    )
    assert a == b
    assert len(a[0].tokens) <= 5 and len(a[1].tokens) <= 12
    # a row's sample with its own seed does not depend on its batch-mates
    params = SamplingParams(temperature=1.0, max_tokens=10)
    alone = policy.sample(ps[1:], params, seeds=[99])[0]
    together = policy.sample([ps[0], ps[1], ps[0]], params, seeds=[1, 99, 2])[1]
    assert alone.tokens == together.tokens


def test_gumbel_sampling_follows_the_distribution(policy):
    """Empirical frequencies of the first sampled token match softmax(logits / T)."""
    (p,) = prompts(policy, ["Pick a random word."])
    with torch.no_grad():
        logits = policy.model(torch.tensor([p])).logits[0, -1].float()
    probs = torch.softmax(logits / 1.5, -1)
    n = 600
    out = policy.sample(
        [p] * n, SamplingParams(temperature=1.5, max_tokens=1), seeds=list(range(n))
    )
    counts = (
        torch.bincount(torch.tensor([c.tokens[0] for c in out]), minlength=probs.numel()).float()
        / n
    )
    top = probs.topk(3).indices
    assert torch.allclose(counts[top], probs[top], atol=0.06), (counts[top], probs[top])


def test_min_tokens_holds_off_stop_tokens_and_stop_strings(policy):
    ps = prompts(policy, ["Reply with one word: yes or no?", "Hi"])
    free = policy.sample(ps, SamplingParams(temperature=0, max_tokens=40))
    assert all(
        c.finish_reason == "stop" and len(c.tokens) < 12 for c in free
    )  # short replies without it
    held = policy.sample(ps, SamplingParams(temperature=0, max_tokens=40, min_tokens=12))
    for c in held:
        assert len(c.tokens) >= 12 and not set(c.tokens[:11]) & policy.stop_token_ids
    sentence = prompts(policy, ["Tell me about the sea."])  # a stop string (" ") that comes at once
    (early,) = policy.sample(sentence, SamplingParams(temperature=0, max_tokens=40, stop=(" ",)))
    (late,) = policy.sample(
        sentence, SamplingParams(temperature=0, max_tokens=40, stop=(" ",), min_tokens=6)
    )
    assert early.stop_text == " " and len(early.tokens) < 6
    assert late.stop_text == " " and len(late.tokens) == 6


def test_stop_strings_end_a_reply(policy):
    ps = prompts(policy, ["Count: 1, 2, 3, 4, 5, 6, 7, 8"])
    (c,) = policy.sample(ps, SamplingParams(temperature=0, max_tokens=40, stop=(",",)))
    text = policy.tokenizer.decode(list(c.tokens))
    assert c.finish_reason == "stop" and c.stop_text == "," and "," in text


def test_real_rollout_against_the_quickstart_server(policy, tmp_path):
    """The default model, the quickstart job and its HTTP environment in a subprocess:
    the prompts the model saw are prefixes of the record, and a tool call was executed."""
    from agentrft.data import load_dataset
    from agentrft.job import load_job
    from agentrft.rollout.group import run_groups
    from agentrft.runtime import job_environment, sampling_params, settings_from_job

    job = load_job(ROOT / "examples/quickstart/job.yaml")
    items = load_dataset(job.validation_path)[:2]
    seen: list[list[int]] = []
    real_sample = policy.sample

    def recording_sample(ps, params, max_tokens=None, seeds=None, **cache):
        seen.extend(list(p) for p in ps)
        return real_sample(ps, params, max_tokens, seeds, **cache)

    policy.sample = recording_sample
    try:
        with job_environment(job) as url:
            settings = settings_from_job(job, policy, url)
            groups = run_groups(items, 2, settings, policy, sampling_params(job, seed=1))
    finally:
        del policy.sample
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4 and all(t.discarded is None for t in trajs)
    for p in seen:  # every prompt the model saw is a prefix of exactly one trajectory
        assert sum(list(t.tokens[: len(p)]) == p for t in trajs) >= 1
    executed = [r for t in trajs for r in t.tool_results if r.status == "ok"]
    assert executed, "the model made no valid call: prompt design regressed"
    assert any("capital:" in r.output for r in executed)
    for t in trajs:
        sampled = [tok for tok, o in zip(t.tokens, t.origins, strict=True) if o == Origin.SAMPLED]
        assert sum(turn.sampled_tokens for turn in t.turns) == len(sampled)
        assert t.stop_reason in set(StopReason)


def test_rollout_cli_writes_records(tmp_path, capsys):
    from agentrft.cli import main

    out = tmp_path / "r"
    assert (
        main(
            [
                "rollout",
                str(ROOT / "examples/quickstart/job.yaml"),
                "-n",
                "2",
                "--rows",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    recs = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for r in recs:
        assert (
            r["trace_id"].startswith("trace_") and r["stop_reason"] and r["tokens"]["sampled"] > 0
        )
        assert r["messages"][-1]["role"] == "assistant"
    assert "rollouts" in capsys.readouterr().out
