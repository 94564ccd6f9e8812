"""Grammar-constrained tool calls (`policy.constrain`) in both sampling loops: the static one
of `HFPolicy.sample` (rollouts) and the continuous one of serve-model's scheduler. A tiny
random Llama over the real tokenizer writes garbage on its own, so a reply that parses as a
schema-valid call shows that the mask was applied; its log-probs must be those of the model's
unmasked distribution (what the trainer recomputes), and a token the mask left alone is marked
forced."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from agentrft.policy import Completion, SamplingParams
from agentrft.policy.constrain import tool_call_grammar
from agentrft.policy.hf import HFPolicy
from agentrft.policy.tool_format import OPEN, parse_reply
from agentrft.serve.scheduler import DecodeScheduler
from tests.unit.tiny_models import tiny_llama

SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "boolean"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [("get_weather", SCHEMA)]


@pytest.fixture(scope="module")
def policy(tokenizer: Any) -> HFPolicy:
    model = tiny_llama(vocab=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return HFPolicy(model, tokenizer)


def prompt(tokenizer: Any) -> list[int]:
    return list(tokenizer.encode("What is the weather in Paris?"))


def valid_calls(tokenizer: Any, completions: list[Completion], prefix: str = "") -> int:
    """How many replies are exactly one call that matches the schema."""
    ok = 0
    for c in completions:
        text = prefix + tokenizer.decode(list(c.reply_tokens))
        parsed = parse_reply(text, {"get_weather": SCHEMA})
        ok += c.ended_by_stop_token and len(parsed.calls) == 1 and parsed.calls[0].error is None
    return ok


def test_the_static_loop_samples_only_valid_calls(policy: HFPolicy, tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required")
    params = SamplingParams(max_tokens=80, constraint=grammar)
    done = policy.sample([prompt(tokenizer)] * 6, params, seeds=range(6))
    assert valid_calls(tokenizer, done) == 6
    free = policy.sample([prompt(tokenizer)] * 6, SamplingParams(max_tokens=80), seeds=range(6))
    assert valid_calls(tokenizer, free) == 0  # the model alone: the test can fail


def test_recorded_logprobs_are_unmasked_and_the_grammars_only_choices_are_forced(
    policy: HFPolicy, tokenizer: Any
) -> None:
    grammar = tool_call_grammar(TOOLS, "named", name="get_weather", inside_call=True)
    ids = prompt(tokenizer) + list(tokenizer.encode(OPEN + '{"name": "get_weather", "arguments": '))
    (c,) = policy.sample([ids], SamplingParams(max_tokens=40, constraint=grammar), seeds=[3])
    rules = policy.row_rules()
    matcher = grammar.matcher(tokenizer, rules.vocab_size, rules.stop_token_ids)
    ctx = list(ids)
    seen = set()
    assert len(c.forced) == len(c.tokens)
    with torch.no_grad():
        for tok, logp, forced in zip(c.tokens, c.logprobs, c.forced, strict=True):
            logits = policy.model(torch.tensor([ctx])).logits[:, -1, :].float()
            plain = torch.log_softmax(logits, -1)[0, tok].item()
            from agentrft.policy.constrain import apply_grammars

            apply_grammars(logits, [(0, matcher)], None)
            masked = torch.log_softmax(logits, -1)[0, tok].item()
            assert logp == pytest.approx(plain, abs=1e-4)
            assert forced == (int(torch.isfinite(logits).sum()) == 1)
            seen.add(forced)
            matcher.accept_token(tok)
            ctx.append(tok)
    assert seen == {True, False}  # the call's keys are forced, its values are choices
    assert masked >= plain - 1e-6
    text = OPEN + '{"name": "get_weather", "arguments": ' + tokenizer.decode(list(c.reply_tokens))
    assert json.loads(text[len(OPEN) : text.index("</tool_call>")])["arguments"]["city"] in (
        "Paris",
        "Rome",
    )


def test_the_continuous_loop_samples_only_valid_calls(policy: HFPolicy, tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", inside_call=True)
    params = SamplingParams(max_tokens=80, constraint=grammar)
    scheduler = DecodeScheduler(policy, max_running=8)
    ids = prompt(tokenizer) + list(tokenizer.encode(OPEN))

    async def run() -> list[Completion]:
        out: dict[int, Completion] = {}
        async for i, event in scheduler.generate(ids, params, [1, 2, 3, 4]):
            if isinstance(event, Completion):
                out[i] = event
        return [out[i] for i in range(4)]

    done = asyncio.run(run())
    assert valid_calls(tokenizer, done, prefix=OPEN) == 4
    scheduler.close()


def test_a_prefill_deep_inside_a_call_leaves_only_the_rest_to_the_model(
    policy: HFPolicy, tokenizer: Any
) -> None:
    """`auto` after a prefill that opened the call and its first argument: the matcher reads
    the prefill, so the model may only finish that call (the repair job's shape)."""
    prefill = OPEN + '{"name": "get_weather", "arguments": {"city": '
    grammar = tool_call_grammar(TOOLS, "auto").after(prefill)
    ids = prompt(tokenizer) + list(tokenizer.encode(prefill))
    stop = ("</tool_call>",)
    done = policy.sample(
        [ids] * 6, SamplingParams(max_tokens=40, stop=stop, constraint=grammar), seeds=range(6)
    )

    def valid(c: Completion) -> bool:
        parsed = parse_reply(prefill + tokenizer.decode(list(c.tokens)), {"get_weather": SCHEMA})
        return len(parsed.calls) == 1 and parsed.calls[0].error is None

    assert all(valid(c) for c in done)
    free = policy.sample([ids] * 6, SamplingParams(max_tokens=40, stop=stop), seeds=range(6))
    assert not any(valid(c) for c in free)  # the model alone: the test can fail


def test_after_is_one_grammar_per_prefix_and_a_prefill_off_the_grammar_is_named(
    policy: HFPolicy, tokenizer: Any
) -> None:
    from agentrft.policy import after_prefill
    from agentrft.policy.constrain import ConstraintError

    grammar = tool_call_grammar(TOOLS, "auto")
    assert grammar.after("") is grammar
    assert grammar.after(OPEN) is grammar.after(OPEN)  # its rows batch together
    params = SamplingParams(constraint=grammar)
    assert after_prefill(params, None) is None and after_prefill(SamplingParams(), OPEN) is None
    assert after_prefill(params, OPEN) == after_prefill(params, OPEN)
    rules = policy.row_rules()
    bad = grammar.after(OPEN + '{"name": "no_such_tool"')
    with pytest.raises(ConstraintError, match="no_such_tool"):
        bad.matcher(tokenizer, rules.vocab_size, rules.stop_token_ids)


def test_a_whitespace_stop_would_cut_a_constrained_call_so_a_job_refuses_it(
    policy: HFPolicy, tokenizer: Any
) -> None:
    """The grammar lets a call's JSON have whitespace between tokens, so a stop string of
    whitespace alone ("\n\n") can end the reply mid-call (the repair job's trained model did:
    `{"candidate": 1\n\n`, an invalid call). A job with such a stop and constrained calls is
    refused at load, naming the stop and the fix."""
    from agentrft.job import Sampling

    prefill = OPEN + '{"name": "get_weather", "arguments": {"city": "Paris", "days": true'
    rules = policy.row_rules()
    matcher = tool_call_grammar(TOOLS, "auto").matcher(
        tokenizer, rules.vocab_size, rules.stop_token_ids
    )
    assert matcher.accept_string(prefill + "\n\n")  # the stop would fire here
    assert parse_reply(prefill + "\n\n", {"get_weather": SCHEMA}).calls[0].error
    with pytest.raises(ValueError, match=r"stop '\\n\\n' can end a reply inside"):
        Sampling(stop=["</tool_call>", "\n\n"], constrained_tool_calls=True)
    Sampling(stop=["</tool_call>", "\n\n"])  # unconstrained calls: a stop like any other
    Sampling(stop=["</tool_call>", "}}", "\n\n\n\n\n"], constrained_tool_calls=True)


def test_forced_tokens_are_kept_in_the_context_but_not_trained() -> None:
    from agentrft.rollout.context import Context
    from agentrft.train.update import Scored
    from agentrft.types import Item, Origin, StopReason, Trajectory

    ctx = Context()
    ctx.insert([1, 2], [Origin.PROMPT] * 2)
    ctx.sampled([5, 6, 7], [-0.1, -9.0, -0.3], [False, True, False])
    ctx.sampled([8], [-0.2])  # an engine that does not say: every token was a choice
    assert ctx.origins[2:] == [Origin.SAMPLED, Origin.FORCED, Origin.SAMPLED, Origin.SAMPLED]
    traj = Trajectory(
        "t",
        Item(0, (), {}, "x.jsonl:1"),
        (),
        (),
        tuple(ctx.tokens),
        tuple(ctx.origins),
        tuple(ctx.logprobs),
        StopReason.FINAL_ANSWER,
    )
    scored = Scored.from_trajectory(traj, advantage=-1.0)
    assert scored.targets == [2, 4, 5]
    assert scored.sampler_logp == [-0.1, -0.3, -0.2]
