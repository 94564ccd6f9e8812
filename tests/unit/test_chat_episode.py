"""The message-level episode (chat endpoint) against the token-level one (local policy):
same scripted model, same tools, so the same prompts, calls, tool outputs and stop reasons.
The endpoint is `serve-model` itself, over HTTP."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from agentrft.errors import ConfigError
from agentrft.job import ToolSpec
from agentrft.policy import SamplingParams
from agentrft.policy.openai_client import ChatRequestRejected, OpenAIChat
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.chat_episode import ChatRolloutSettings, openai_history, run_chat_episode
from agentrft.rollout.context import ChatRenderer
from agentrft.rollout.episode import RolloutSettings, run_episode
from agentrft.serve.app import create_app
from agentrft.tools import build_tools
from agentrft.tools.envkit import serve_in_thread
from agentrft.tools.http import new_client
from agentrft.types import Item, StopReason, Trajectory
from tests.conftest import ScriptedPolicy

PARAMS = {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}
SPECS = [
    ToolSpec(
        name="lookup",
        description="Facts about a country.",
        parameters=PARAMS,
        function="tests.unit.pytools:lookup",
    ),
    ToolSpec(
        name="fragile", function="tests.unit.pytools:fragile"
    ),  # always fails: the rollout is discarded
]
TOOLS = build_tools(SPECS, timeout_s=5, retries=1, backoff_s=0.0)
SYSTEM = "You look things up."
FEW_SHOT = (
    {"role": "user", "content": "Capital of Norway?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "lookup", "arguments": {"country": "Norway"}}</tool_call>',
    },
    {"role": "tool", "content": "capital: Oslo"},
    {"role": "assistant", "content": "Oslo."},
)
ITEM = Item(0, ({"role": "user", "content": "Capital of Peru?"},), {"country": "Peru"}, "test:1")
CALL = '<tool_call>{"name": "lookup", "arguments": {"country": "Peru"}}</tool_call>'


class Script:
    """The replies for the current scenario, in order; records every prompt it is shown."""

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.prompts: list[str] = []

    def __call__(self, prompt: str, turn: int) -> str:
        self.prompts.append(prompt)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def policy(script: Script, tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, script)


@pytest.fixture(scope="module")
def endpoint(policy: ScriptedPolicy) -> Iterator[OpenAIChat]:
    with serve_in_thread(create_app(policy, "scripted")) as url:
        yield OpenAIChat(url + "/v1", "scripted", api_key_env=None, retries=0)


def both(
    script: Script, policy: ScriptedPolicy, endpoint: OpenAIChat, replies: list[str], **kw: Any
) -> tuple[Trajectory, list[str], Trajectory, list[str]]:
    """Run the scenario once per driver; return each trajectory with the prompts it showed."""
    token_kw = {k: v for k, v in kw.items() if k not in ("sampling", "prefill")}
    if "prefill" in kw:
        token_kw["prefills"] = (kw["prefill"],)
    renderer = ChatRenderer(policy.tokenizer, SPECS, SYSTEM, FEW_SHOT)

    async def token() -> Trajectory:
        sampler = BatchedSampler(policy, SamplingParams(max_tokens=256))
        async with new_client() as client:
            traj = await run_episode(
                ITEM, RolloutSettings(renderer=renderer, tools=TOOLS, **token_kw), sampler, client
            )
        await sampler.aclose()
        return traj

    async def chat() -> Trajectory:
        settings = ChatRolloutSettings(
            tools=TOOLS, system_prompt=SYSTEM, few_shot_messages=FEW_SHOT, **kw
        )
        async with new_client() as client:
            return await run_chat_episode(ITEM, settings, endpoint, client)

    script.replies, script.prompts = list(replies), []
    a = asyncio.run(token())
    prompts_a = script.prompts
    script.replies, script.prompts = list(replies), []
    b = asyncio.run(chat())
    return a, prompts_a, b, script.prompts


SCENARIOS: dict[str, tuple[list[str], dict[str, Any], StopReason, int]] = {
    "final answer": (["Lima."], {}, StopReason.FINAL_ANSWER, 1),
    "call, then answer": (["Checking. " + CALL, "It is Lima."], {}, StopReason.FINAL_ANSWER, 2),
    "unknown tool": (
        ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "ok"],
        {},
        StopReason.FINAL_ANSWER,
        2,
    ),
    "bad arguments": (
        ['<tool_call>{"name": "lookup", "arguments": {"country": 3}}</tool_call>', "ok"],
        {},
        StopReason.FINAL_ANSWER,
        2,
    ),
    "tool says no": (
        ['<tool_call>{"name": "lookup", "arguments": {"country": "Atlantis"}}</tool_call>', "ok"],
        {},
        StopReason.FINAL_ANSWER,
        2,
    ),
    "call budget": ([CALL + CALL], {"max_tool_calls": 1}, StopReason.MAX_TOOL_CALLS, 1),
    "step limit": ([CALL], {"max_episode_steps": 2}, StopReason.MAX_EPISODE_STEPS, 2),
    "reply cut off": (["x" * 50], {"max_tokens_per_turn": 10}, StopReason.MAX_TOKENS, 1),
    "episode token budget": ([CALL], {"max_tokens_per_episode": 40}, StopReason.MAX_TOKENS, 2),
    "tool down": (
        ['<tool_call>{"name": "fragile", "arguments": {}}</tool_call>'],
        {},
        StopReason.TOOL_ERROR,
        1,
    ),
    # `end_when`: the environment says the task is over; nothing after it is sampled
    "a tool ends it": ([CALL, CALL], {"end_when": "capital:"}, StopReason.ENDED_BY_TOOL, 1),
    "an error never ends it": (  # it may echo the model's own words
        ['<tool_call>{"name": "lookup", "arguments": {"country": "Atlantis"}}</tool_call>', "ok"],
        {"end_when": "Atlantis"},
        StopReason.FINAL_ANSWER,
        2,
    ),
    "prefill": (
        ['{"name": "lookup", "arguments": {"country": "Peru"}}</tool_call>', "Lima."],
        {"prefill": "<tool_call>"},
        StopReason.FINAL_ANSWER,
        2,
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_rollout_through_either_driver(
    name: str, script: Script, policy: ScriptedPolicy, endpoint: OpenAIChat
) -> None:
    replies, kw, stop, turns = SCENARIOS[name]
    token, token_prompts, chat, chat_prompts = both(script, policy, endpoint, replies, **kw)
    assert token.stop_reason == chat.stop_reason == stop
    assert len(token.turns) == len(chat.turns) == turns
    assert chat_prompts == token_prompts  # the model saw exactly the same text each turn
    assert [(c.name, c.arguments, c.error) for c in chat.tool_calls] == [
        (c.name, c.arguments, c.error) for c in token.tool_calls
    ]
    assert [(r.output, r.status) for r in chat.tool_results] == [
        (r.output, r.status) for r in token.tool_results
    ]
    assert (chat.discarded is None) == (token.discarded is None)
    assert chat.sampled_tokens == token.sampled_tokens > 0
    assert chat.tokens == () and len(token.tokens) > 0  # the endpoint hides tokens: not trainable
    assert chat.trace_id.startswith("trace_") and chat.trace_id != token.trace_id
    for msg in chat.messages:  # every tool message answers a call the endpoint can match
        assert msg["role"] != "tool" or msg.get("tool_call_id")


def test_context_overflow_ends_the_rollout(
    script: Script, policy: ScriptedPolicy, endpoint: OpenAIChat
) -> None:
    script.replies = [CALL]
    settings = ChatRolloutSettings(
        tools=TOOLS,
        system_prompt=SYSTEM,
        max_tokens_per_turn=policy.context_window,
        max_tokens_per_episode=policy.context_window,
    )

    async def run() -> Trajectory:
        async with new_client() as client:
            return await run_chat_episode(ITEM, settings, endpoint, client)

    traj = asyncio.run(run())
    assert traj.stop_reason == StopReason.CONTEXT_OVERFLOW and traj.turns == ()


def test_other_rejections_raise(endpoint: OpenAIChat) -> None:
    wrong = OpenAIChat(endpoint.base_url, "gpt-4o", api_key_env=None, retries=0)
    settings = ChatRolloutSettings(tools=TOOLS)

    async def run() -> Trajectory:
        async with new_client() as client:
            return await run_chat_episode(ITEM, settings, wrong, client)

    with pytest.raises(ChatRequestRejected) as info:
        asyncio.run(run())
    assert info.value.status == 404 and info.value.code == "model_not_found"


def test_few_shot_history_gets_openai_ids() -> None:
    out = openai_history(FEW_SHOT, {"lookup": PARAMS})
    call = out[1]["tool_calls"][0]
    assert out[1]["content"] is None and call["function"] == {
        "name": "lookup",
        "arguments": '{"country": "Norway"}',
    }
    assert out[2] == {"role": "tool", "content": "capital: Oslo", "tool_call_id": call["id"]}
    assert out[3] == FEW_SHOT[3]


def test_prefills_an_endpoint_cannot_take_are_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be sent to a chat endpoint"):
        ChatRolloutSettings(tools=TOOLS, prefill="{")
    with pytest.raises(ConfigError, match="needs at least one tool"):
        ChatRolloutSettings(tools={}, prefill="<tool_call>")


def test_settings_and_client_are_picklable(endpoint: OpenAIChat) -> None:
    """Rollout workers (Ray actors) receive both by pickling."""
    settings = ChatRolloutSettings(
        tools=TOOLS, system_prompt=SYSTEM, few_shot_messages=FEW_SHOT, prefill="<tool_call>"
    )
    assert pickle.loads(pickle.dumps(endpoint)) == endpoint
    copy = pickle.loads(pickle.dumps(settings))
    assert copy.schemas == settings.schemas and copy.few_shot_messages == FEW_SHOT


def test_prefill_ends_once_a_tool_output_has_the_until_text() -> None:
    """The condition both drivers use for `prefill_until` (an endpoint's reply is then sent
    without tool_choice="required"): tool outputs only, not the user's or model's words."""
    settings = ChatRolloutSettings(
        tools=TOOLS, prefill="<tool_call>", prefill_all_turns=True, prefill_until="capital:"
    )
    asked = [{"role": "user", "content": "capital: of Norway?"}]
    assert not settings.prefill_ended(asked)
    assert settings.prefill_ended([*asked, {"role": "tool", "content": "capital: Oslo"}])
    assert not ChatRolloutSettings(tools=TOOLS, prefill="<tool_call>").prefill_ended(
        [{"role": "tool", "content": "capital: Oslo"}]
    )
