"""serve-model's queued-token cap (429 with Retry-After, read by the official SDK), and the
rollout option that turns on constrained tool calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentrft.job import job_from_dict
from agentrft.policy.constrain import ToolCallGrammar
from agentrft.runtime import sampling_params
from agentrft.serve.admission import TokenBudget
from agentrft.serve.app import ChatService, create_app
from agentrft.serve.protocol import RequestError
from agentrft.tools.envkit import serve_in_thread
from tests.conftest import ScriptedPolicy
from tests.unit.test_serve_protocol import MODEL, respond


@pytest.fixture(scope="module")
def served(tokenizer: Any) -> Iterator[tuple[str, ChatService]]:
    policy = ScriptedPolicy(tokenizer, respond, context_window=2048)
    app = create_app(policy, MODEL, max_queued_tokens=1000)
    with serve_in_thread(app) as url:
        yield url, app.state.service


def test_past_the_queued_token_cap_a_request_gets_429(served: tuple[str, ChatService]) -> None:
    url, service = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "sunny?"}]}
    assert client.chat.completions.create(**ask, n=2, max_tokens=400).choices  # 800 fits
    held = service.budget.reserve(900)  # as if requests were decoding
    try:
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(**ask, max_tokens=200)
        assert int(err.value.response.headers["retry-after"]) >= 1
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**ask, max_tokens=200, stream=True)
    finally:
        held.release()
    assert service.budget.used == 0  # every finished request gave its tokens back
    with pytest.raises(openai.BadRequestError, match="over this server's limit"):
        client.chat.completions.create(**ask, n=3, max_tokens=400)  # could never run
    assert client.chat.completions.create(**ask, max_tokens=200).choices


def test_a_budget_refuses_then_frees() -> None:
    budget = TokenBudget(100)
    a = budget.reserve(60)
    with pytest.raises(RequestError) as err:
        budget.reserve(50)
    assert err.value.status == 429 and "Retry-After" in err.value.headers
    a.release()
    a.release()  # idempotent
    assert budget.used == 0
    budget.reserve(100).release()


TOOL = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}


def job(**agentrft: Any) -> Any:
    return job_from_dict(
        {
            "training_file": "train.jsonl",
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {
                        "type": "string_check",
                        "name": "s",
                        "input": "{{sample.output_text}}",
                        "reference": "x",
                        "operation": "eq",
                    },
                    "tools": [{**TOOL, "server_url": "http://127.0.0.1:9/lookup"}],
                },
            },
            "agentrft": agentrft,
        }
    )


def test_constrained_tool_calls_is_a_job_option_off_by_default() -> None:
    assert sampling_params(job()).constraint is None
    on = sampling_params(job(sampling={"constrained_tool_calls": True})).constraint
    assert isinstance(on, ToolCallGrammar)
    assert on.structural_tag["format"]["type"] == "triggered_tags"
    # a prefill that opens a call is read by the grammar first (test_constrained_decoding)
    opened = sampling_params(job(sampling={"constrained_tool_calls": True}, prefill="<tool_call>"))
    assert isinstance(opened.constraint, ToolCallGrammar) and opened.constraint.prefix == ""
