"""serve-model's OpenAI surface, driven by the official `openai` client over real HTTP, with
a scripted policy so every reply is known (the real model is in tests/integration)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agentrft.serve.app import create_app
from agentrft.tools.envkit import serve_in_thread
from tests.conftest import ScriptedPolicy

MODEL = "scripted"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def last_turn(prompt: str) -> str:
    """The text after the last user or tool header: what this reply answers."""
    at = max(prompt.rfind("<|im_start|>user\n"), prompt.rfind("<|im_start|>tool\n"))
    return prompt[at:]


def respond(prompt: str, turn: int = 0) -> str:
    turn = last_turn(prompt)
    if prompt.endswith("<tool_call>"):  # tool_choice="required": the reply was prefilled
        return '{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    if prompt.endswith('"arguments": '):  # a named tool_choice
        return '{"city": "Oslo"}}</tool_call>'
    for key, reply in {
        "weather": "Let me check. " + CALL,
        "broken": '<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>',
        "two calls": CALL + CALL.replace("Paris", "Lima"),
        "sunny": "It is sunny in Paris.",
        "stopword": "alpha beta STOP gamma",
        "echo": prompt,
    }.items():
        if key in turn:
            return reply
    return "Hello there."


@pytest.fixture(scope="module")
def policy(tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, respond, context_window=2048, delay_s=0.05)


@pytest.fixture(scope="module")
def base_url(policy: ScriptedPolicy) -> Iterator[str]:
    with serve_in_thread(create_app(policy, MODEL, max_batch=8)) as url:
        yield url + "/v1"


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_models_and_plain_chat(client: openai.OpenAI, policy: ScriptedPolicy) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.3,
        top_p=0.9,
        seed=5,
        max_tokens=40,
    )
    (c,) = r.choices
    assert (c.message.content, c.finish_reason, c.message.tool_calls) == (
        "Hello there.",
        "stop",
        None,
    )
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    prompt_len = len(policy.tokenizer.encode(prompt, add_special_tokens=False))
    reply_len = (
        len(policy.tokenizer.encode("Hello there.", add_special_tokens=False)) + 1
    )  # + the stop token
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_len, reply_len)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    rows, params, seeds = policy.calls[-1]
    assert (params.temperature, params.top_p, params.max_tokens) == (0.3, 0.9, 40)
    assert (
        rows == 1 and seeds is not None and len(seeds) == 1
    )  # the request's seed, as its own stream


def test_null_fields_mean_defaults(base_url: str, policy: ScriptedPolicy) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "n": None,
        "temperature": None,
        "top_p": None,
        "stream": None,
        "max_tokens": None,
        "stop": None,
    }
    reply = httpx.post(base_url + "/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "Hello there."
    _, params, seeds = policy.calls[-1]
    assert (params.temperature, params.top_p, params.stop, seeds) == (1.0, 1.0, (), None)


def test_tools_come_back_as_tool_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],
        temperature=0,
    )
    (c,) = r.choices
    assert c.finish_reason == "tool_calls"
    assert (
        c.message.content == "Let me check. "
    )  # as written: the call is appended to it again in the history
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )


def test_tool_schemas_reach_the_prompt_and_history_is_inlined(client: openai.OpenAI) -> None:
    """Tools in agentrft's format (system prompt), the assistant's earlier call written back
    as a <tool_call> block, the tool output as a tool message."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
        {"role": "user", "content": "echo"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=1000
    )
    prompt = r.choices[0].message.content
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in prompt and '"required": ["city"]' in prompt
    assert (
        f"<|im_start|>assistant\n{CALL}<|im_end|>\n<|im_start|>tool\nsunny, 24 C<|im_end|>\n"
        in prompt
    )


def test_malformed_call_is_returned_as_text(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "broken"}], tools=[WEATHER]
    )
    (c,) = r.choices
    assert c.finish_reason == "stop" and c.message.tool_calls is None
    assert c.message.content.startswith('<tool_call>{"name": "get_weather", "arguments": {"town"')


def test_several_calls_in_one_reply(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "two calls"}], tools=[WEATHER]
    )
    calls = r.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Lima"]
    assert len({c.id for c in calls}) == 2 and r.choices[0].message.content is None


def test_tool_choice(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "anything"}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required"
    )
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Rome"}
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice=named
    )
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather"}],
        tools=[WEATHER],
        tool_choice="none",
    )
    assert (
        r.choices[0].finish_reason == "stop" and CALL in r.choices[0].message.content
    )  # not parsed


def test_stop_strings_and_length(client: openai.OpenAI, policy: ScriptedPolicy) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stopword"}], stop=["STOP"]
    )
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("alpha beta ", "stop")
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stopword"}], max_completion_tokens=3
    )
    first3 = policy.tokenizer.decode(
        policy.tokenizer.encode("alpha beta STOP gamma", add_special_tokens=False)[:3]
    )
    assert (
        r.choices[0].message.content,
        r.choices[0].finish_reason,
        r.usage.completion_tokens,
    ) == (first3, "length", 3)


def test_n_choices_are_one_sample_call(client: openai.OpenAI, policy: ScriptedPolicy) -> None:
    before = len(policy.calls)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather"}],
        tools=[WEATHER],
        n=3,
        seed=11,
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason == "tool_calls" for c in r.choices)
    ((rows, _, seeds),) = policy.calls[before:]
    assert rows == 3 and seeds is not None and len(set(seeds)) == 3  # one stream per choice
    reply_tokens = (
        len(policy.tokenizer.encode("Let me check. " + CALL, add_special_tokens=False)) + 1
    )  # + the stop token
    assert r.usage.completion_tokens == 3 * reply_tokens


def test_concurrent_requests_share_a_batch(base_url: str, policy: ScriptedPolicy) -> None:
    async def burst() -> list[str | None]:
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        replies = await asyncio.gather(
            *(
                aclient.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"hi {i}"}], temperature=0.5
                )
                for i in range(6)
            )
        )
        await aclient.close()
        return [r.choices[0].message.content for r in replies]

    before = len(policy.calls)
    assert asyncio.run(burst()) == ["Hello there."] * 6
    sizes = [rows for rows, *_ in policy.calls[before:]]
    assert sum(sizes) == 6 and len(sizes) < 6 and max(sizes) >= 2, sizes


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be one of"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "tool_call_id",
        ),
        (
            {"messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
            "string or a list of text parts",
        ),
        ({"messages": []}, "messages", "at least 1"),
        (
            {"messages": [{"role": "user", "content": "x"}], "n": 0},
            "n",
            "greater than or equal to 1",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "temperature",
            "less than or equal to 2",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "stream_options": {"include_usage": True},
            },
            "stream_options",
            "stream=true",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": "get_weather"},
            },
            "tool_choice",
            "tool_choice",
        ),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role", "must be one of"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                    },
                    {"role": "user", "content": "x"},
                ]
            },
            "messages[0].tool_calls",
            "JSON string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content",
            "list of text parts",
        ),
        (
            {"messages": [{"role": "tool", "tool_call_id": ["x"], "content": "x"}]},
            "messages[0].tool_call_id",
            "tool_call_id",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**70}, "seed", "less than"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {}}],
            },
            "tools",
            "name",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
            "tool_choice",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
            "messages",
            "maximum context length is 2048",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    client: openai.OpenAI, body: dict, param: str, fragment: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, **body)
    err = info.value.body
    assert info.value.status_code == 400
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert fragment in err["message"], err["message"]


def test_context_overflow_code_and_unknown_model(client: openai.OpenAI, base_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": " ".join(str(i) for i in range(2000))}],
        )
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found" and MODEL in missing.value.message
    reply = httpx.post(
        base_url + "/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


def test_min_tokens_reaches_the_sampler(client: openai.OpenAI, policy: ScriptedPolicy) -> None:
    """vLLM's extra `min_tokens` is honoured, not silently ignored; a bad one is a 400."""
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"min_tokens": 5}
    )
    assert policy.calls[-1][1].min_tokens == 5
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert policy.calls[-1][1].min_tokens == 0
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"min_tokens": -1}
        )
