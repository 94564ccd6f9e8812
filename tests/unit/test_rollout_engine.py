"""The rollout engine, token-in/token-out: what the model saw is what was recorded, only
sampled tokens are trainable, and every stop rule ends the episode with its reason."""

from __future__ import annotations

import json

from agentrft.job import ToolSpec
from agentrft.policy import SamplingParams
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings
from agentrft.rollout.group import run_groups
from agentrft.tools import build_tools
from agentrft.types import Item, Origin, StopReason
from tests.conftest import ScriptedPolicy

SPECS = [
    ToolSpec(
        name="add",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        function="tests.unit.pytools:add",
    ),
]


def call(a, b):
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def run(tokenizer, replies, n=1, sampling_max=200, few_shot=(), **settings):
    renderer = ChatRenderer(
        tokenizer, SPECS, system_prompt="You add numbers.", few_shot_messages=few_shot
    )
    rs = RolloutSettings(
        renderer=renderer,
        tools=build_tools(SPECS, timeout_s=5, retries=0, backoff_s=0),
        **settings,
    )
    policy = ScriptedPolicy(
        tokenizer, replies, fewshot_turns=sum(m["role"] == "assistant" for m in few_shot)
    )
    items = [Item(0, ({"role": "user", "content": "What is 2 + 3, then + 4?"},), {}, "t:0")]
    (group,) = run_groups(items, n, rs, policy, SamplingParams(max_tokens=sampling_max))
    return group.trajectories, policy


def test_recorded_tokens_are_exactly_what_the_model_saw(tokenizer):
    few = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": call(1, 1)},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]
    (traj,), policy = run(
        tokenizer,
        [call(2, 3)[len("<tool_call>") :], call(5, 4), "The answer is 9."],
        few_shot=few,
        prefills=("<tool_call>",),
    )
    assert all(c.error is None for c in traj.tool_calls)
    assert traj.stop_reason == StopReason.FINAL_ANSWER and len(traj.turns) == 3
    assert len(policy.prompts) == 3
    for prompt in policy.prompts:  # every prompt is a prefix of the final record, unchanged
        assert list(traj.tokens[: len(prompt)]) == prompt
    # between prompts, only sampled tokens and inserted ones; the sampled ones are the model's
    for k, prompt in enumerate(policy.prompts):
        nxt = len(policy.prompts[k + 1]) if k + 1 < len(policy.prompts) else len(traj.tokens)
        span = traj.origins[len(prompt) : nxt]
        n_sampled = sum(1 for o in span if o == Origin.SAMPLED)
        assert n_sampled == traj.turns[k].sampled_tokens
        assert all(o == Origin.SAMPLED for o in span[:n_sampled])  # sampled first, then glue
        assert all(o != Origin.SAMPLED for o in span[n_sampled:])


def test_only_sampled_tokens_are_trainable_and_carry_logprobs(tokenizer):
    (traj,), _ = run(tokenizer, [call(2, 3)[len("<tool_call>") :], "5"], prefills=("<tool_call>",))
    assert traj.turns[0].tool_calls[0].error is None
    for o, lp in zip(traj.origins, traj.logprobs, strict=True):
        assert (lp != 0.0) == (o == Origin.SAMPLED)
    # the prefill is recorded as inserted, and the reply text includes it
    assert traj.count(Origin.PREFILL) == len(
        tokenizer.encode("<tool_call>", add_special_tokens=False)
    )
    assert traj.turns[0].text.startswith("<tool_call>")
    # the tool's output is in the context as TOOL_OUTPUT tokens
    out_ids = [t for t, o in zip(traj.tokens, traj.origins, strict=True) if o == Origin.TOOL_OUTPUT]
    assert tokenizer.decode(out_ids).strip() == "5"
    assert traj.count(Origin.TEMPLATE) > 0 and traj.count(Origin.PROMPT) > 0


def test_incremental_context_equals_a_full_render(tokenizer):
    (traj,), _ = run(tokenizer, [call(2, 3) + call(1, 1), "Done: 5 and 2."])
    renderer = ChatRenderer(tokenizer, SPECS, system_prompt="You add numbers.")
    plain = [{"role": m["role"], "content": m["content"]} for m in traj.messages]
    full = tokenizer.apply_chat_template(plain, tokenize=False)
    assert tokenizer.decode(list(traj.tokens)) == full.rstrip("\n")
    assert renderer is not None


def test_prefill_only_on_first_reply_by_default(tokenizer):
    (traj,), policy = run(
        tokenizer, [call(2, 3)[len("<tool_call>") :], "5"], prefills=("<tool_call>",)
    )
    assert traj.turns[0].tool_calls[0].error is None
    assert not traj.turns[1].text.startswith("<tool_call>")
    (traj,), _ = run(
        tokenizer,
        [call(2, 3)[len("<tool_call>") :], "5"],
        prefills=("<tool_call>",),
        prefill_all_turns=True,
    )
    assert traj.turns[1].text.startswith("<tool_call>")


def test_per_reply_prefills(tokenizer):
    first = '<tool_call>{"name": "add", "arguments": {"a": '
    (traj,), _ = run(tokenizer, ['2, "b": 3}}</tool_call>', '9"]'], prefills=(first, '["'))
    assert traj.turns[0].tool_calls[0].error is None and traj.turns[0].text.startswith(first)
    assert traj.turns[1].text == '["9"]'
    assert traj.count(Origin.PREFILL) == len(
        tokenizer.encode(first, add_special_tokens=False)
    ) + len(tokenizer.encode('["', add_special_tokens=False))


def test_prefills_stop_once_a_tool_says_the_until_text(tokenizer):
    """`prefill_until`: the reply after a tool output that contains it is the model's own
    (a solved task is not made to call again); until then the per-reply prefills go on."""
    first = '<tool_call>{"name": "add", "arguments": {"a": '
    replies = ['2, "b": 3}}</tool_call>', "Done."]
    (traj,), _ = run(tokenizer, replies, prefills=(first, first), prefill_until="5")
    assert traj.turns[0].text.startswith(first) and traj.turns[1].text == "Done."
    (traj,), _ = run(tokenizer, replies, prefills=(first, first), prefill_until="7")
    assert traj.turns[1].text.startswith(first)


def test_a_tool_output_with_the_end_text_ends_the_rollout(tokenizer):
    """`end_when`: the calls of the reply that got it ran, and no reply follows (not even
    under a prefill or a step limit); without the text in an output the rollout goes on."""
    first = '<tool_call>{"name": "add", "arguments": {"a": '
    replies = ['2, "b": 3}}</tool_call>', '4, "b": 4}}</tool_call>', "Done."]
    (traj,), policy = run(tokenizer, replies, prefills=(first, first), end_when="5")
    assert traj.stop_reason == StopReason.ENDED_BY_TOOL and len(traj.turns) == 1
    assert [r.output for r in traj.tool_results] == ["5"] and len(policy.prompts) == 1
    assert traj.messages[-1] == {**traj.messages[-1], "role": "tool", "content": "5"}
    (traj,), _ = run(tokenizer, replies, prefills=(first, first), end_when="6")
    assert traj.stop_reason == StopReason.FINAL_ANSWER and len(traj.turns) == 3


def test_stop_rules(tokenizer):
    (t,), _ = run(tokenizer, [call(1, 2)], max_episode_steps=3)
    assert t.stop_reason == StopReason.MAX_EPISODE_STEPS and len(t.turns) == 3
    assert len(t.turns[-1].tool_results) == 1  # the last allowed turn's calls still ran
    (t,), _ = run(tokenizer, [call(1, 2) + call(3, 4)], max_tool_calls=3)
    assert (
        t.stop_reason == StopReason.MAX_TOOL_CALLS
        and len(t.tool_calls) == 4
        and len(t.tool_results) == 2
    )
    (t,), _ = run(tokenizer, ["word " * 50], max_tokens_per_turn=10)
    assert t.stop_reason == StopReason.MAX_TOKENS and t.turns[-1].sampled_tokens == 10
    (t,), _ = run(tokenizer, [call(1, 2)], max_tokens_per_episode=60)
    assert t.stop_reason == StopReason.MAX_TOKENS and t.count(Origin.SAMPLED) <= 60
    (t,), policy = run(tokenizer, [call(1, 2)], context_window=400)
    assert t.stop_reason == StopReason.CONTEXT_OVERFLOW and len(t.tokens) <= 400


def test_group_rollouts_have_distinct_trace_ids(tokenizer):
    trajs, _ = run(tokenizer, [call(1, 2), "3"], n=4)
    assert len({t.trace_id for t in trajs}) == 4
    assert all(json.loads(t.tool_calls[0].arguments) == {"a": 1, "b": 2} for t in trajs)


def test_openai_style_tool_calls_in_few_shot_are_rendered_not_dropped(tokenizer):
    few = [
        {"role": "user", "content": "1+1?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]
    (traj,), policy = run(tokenizer, ["3"], few_shot=few)
    prompt = tokenizer.decode(policy.prompts[0])
    assert '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>' in prompt


# A Qwen3-style template: an assistant reply keeps its <think> block only while it is the
# last message; once the conversation moves on, the template renders it without.
THINK_DROPPING_TEMPLATE = (
    "{%- for m in messages -%}"
    "<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and not loop.last and '</think>' in m.content -%}"
    "{{ m.content.split('</think>')[-1] }}"
    "{%- else -%}{{ m.content }}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def test_a_template_that_drops_earlier_think_blocks_never_rewrites_the_context(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    replies = [
        "<think>first add 2 and 3</think>" + call(2, 3),
        "<think>now add 4</think>" + call(5, 4),
        "<think>done</think>The answer is 9.",
    ]
    (traj,), policy = run(tok, replies)
    assert traj.stop_reason == StopReason.FINAL_ANSWER and len(policy.prompts) == 3
    # turn k+1's context is turn k's plus what was sampled plus the glue: nothing re-rendered
    for k in range(2):
        prompt, nxt = policy.prompts[k], policy.prompts[k + 1]
        n = traj.turns[k].sampled_tokens
        assert nxt[: len(prompt)] == prompt
        assert list(traj.origins[len(prompt) : len(prompt) + n]) == [Origin.SAMPLED] * n
    assert list(traj.tokens[: len(policy.prompts[2])]) == policy.prompts[2]
    # the think blocks the model sampled are still in the trained tokens ...
    text = tok.decode(traj.tokens)
    assert "<think>first add 2 and 3</think>" in text and "<think>now add 4</think>" in text
    # ... although re-rendering the conversation with the template would have dropped them
    rendered = tok.apply_chat_template(
        [*traj.messages, {"role": "user", "content": "ok"}], tokenize=False
    )
    assert "first add 2 and 3" not in rendered
