"""serve-model with the real 135M model, driven by the official `openai` client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest

from agentrft.policy import Completion, SamplingParams
from agentrft.serve.app import create_app
from agentrft.tools.envkit import free_port, serve_in_thread

pytestmark = pytest.mark.integration
MODEL = "smollm2-135m-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def call(city: str, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


# Two worked examples as real conversation turns; with them the model calls the tool at
# temperature 0 (checked by hand for Paris, Tokyo and Berlin). Without them it does not.
FEW_SHOT: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You answer weather questions. First call get_weather, then answer.",
    },
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [call("Rome", "call_a")]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 24 C"},
    {"role": "assistant", "content": "It is sunny and 24 C in Rome."},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [call("Oslo", "call_b")]},
    {"role": "tool", "tool_call_id": "call_b", "content": "snow, -3 C"},
    {"role": "assistant", "content": "It is snowing and -3 C in Oslo."},
]


class CountingPolicy:
    """The real policy, counting `sample` calls and their batch sizes."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.tokenizer, self.stop_token_ids, self.context_window = (
            policy.tokenizer,
            policy.stop_token_ids,
            policy.context_window,
        )
        self.batches: list[int] = []

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        self.batches.append(len(prompts))
        return self.policy.sample(prompts, params, max_tokens, seeds)


@pytest.fixture(scope="module")
def counting(base_policy: Any) -> CountingPolicy:
    return CountingPolicy(base_policy)


@pytest.fixture(scope="module")
def client(counting: CountingPolicy) -> Iterator[openai.OpenAI]:
    with serve_in_thread(create_app(counting, MODEL)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_plain_chat(client: openai.OpenAI) -> None:
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    print(f"n=1, 24 tokens max: {time.perf_counter() - t0:.2f}s")
    (c,) = r.choices
    assert c.finish_reason in ("stop", "length") and c.message.tool_calls is None
    assert "Paris" in c.message.content
    assert 1 <= r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 10


def test_tools_come_back_as_tool_calls(client: openai.OpenAI) -> None:
    messages = [*FEW_SHOT, {"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=40
    )
    (c,) = r.choices
    assert c.finish_reason == "tool_calls", c.message.content
    (tool_call,) = c.message.tool_calls
    assert tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris"}
    # the answer to the call goes back in, and the model answers in words
    messages += [
        c.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "rain, 12 C"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=40
    )
    assert r.choices[0].finish_reason == "stop" and "12" in r.choices[0].message.content


def test_n_choices_in_one_batch(client: openai.OpenAI, counting: CountingPolicy) -> None:
    before = len(counting.batches)
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a fact about cats."}],
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=24,
    )
    print(f"n=4, 24 tokens max: {time.perf_counter() - t0:.2f}s")
    assert len(r.choices) == 4 and counting.batches[before:] == [4]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, texts  # sampled, not one reply copied
    assert r.usage.completion_tokens <= 4 * 24
    # the same seed gives the same choices again
    again = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a fact about cats."}],
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=24,
    )
    assert [c.message.content for c in again.choices] == texts


def test_cli_serves_the_default_model() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrft.cli", "serve-model", "base", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve-model did not start"
                time.sleep(0.5)
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in c.models.list()] == [MODEL]
        r = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert r.usage.completion_tokens <= 4 and r.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)
