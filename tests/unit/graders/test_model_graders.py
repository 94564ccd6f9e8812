"""score_model / label_model through the endpoint judge, against a fake OpenAI-compatible
chat server on loopback returning canned completions (this tests our client and parsing;
a real local judge runs in tests/integration)."""

from __future__ import annotations

import math

import pytest

from agentrft.errors import ConfigError
from agentrft.graders import build_grader, sample_from_text
from agentrft.graders.model import parse_label, parse_score


def completion(content: str | None, refusal: str | None = None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": "stop",
            }
        ],
        "usage": {"total_tokens": 42},
    }


SCORE = {
    "type": "score_model",
    "name": "judge",
    "model": "o4-mini-2025-04-16",
    "input": [
        {"role": "system", "content": "You are an expert grader."},
        {
            "role": "user",
            "content": "Reference: {{ item.reference_answer }}. Model answer: {{ sample.output_text }}",
        },
    ],
    "range": [0, 1],
    "pass_threshold": 0.5,
    "sampling_params": {
        "temperature": 0,
        "seed": 3,
        "max_completions_tokens": 64,
        "reasoning_effort": "low",
    },
}
LABEL = {
    "type": "label_model",
    "name": "cls",
    "model": "gpt-4o-mini-2024-07-18",
    "input": [
        {"role": "developer", "content": "Classify."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Text: {{sample.output_text}}"}],
        },
    ],
    "labels": ["good", "bad"],
    "passing_labels": ["good"],
}


def judge_cfg(url: str, **extra: object) -> dict:
    return {"base_url": f"{url}/v1", "backoff_s": 0.01, **extra}


def test_score_model_request_and_result(recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    rec, url = recorder(
        [(200, completion('{"steps": [{"description": "d", "conclusion": "c"}], "result": 0.8}'))]
    )
    g = build_grader(
        SCORE,
        judge=judge_cfg(url, api_key_env="JUDGE_KEY", models={"o4-mini-2025-04-16": "local-judge"}),
    )
    grade = g.grade(sample_from_text("Paris"), {"reference_answer": "Paris"})
    assert grade.error is None
    assert grade.score == 0.8
    assert grade.metrics["passed"] is True
    assert grade.metrics["token_usage"] == 42
    (req,) = rec.requests
    assert req["path"] == "v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "local-judge"  # mapped by agentrft.judge.models
    assert body["messages"][1] == {
        "role": "user",
        "content": "Reference: Paris. Model answer: Paris",
    }
    assert '"result"' in body["messages"][0]["content"] and body["messages"][0][
        "content"
    ].startswith("You are an expert grader.")
    assert (
        body["temperature"] == 0
        and body["seed"] == 3
        and body["max_completion_tokens"] == 64
        and body["reasoning_effort"] == "low"
    )
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["steps", "result"]


def test_score_is_clipped_to_range(recorder) -> None:
    _, url = recorder([(200, completion('{"result": 7}'))])
    grade = build_grader({**SCORE, "range": [-1, 2]}, judge=judge_cfg(url)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert grade.score == 2.0
    assert grade.metrics["raw_score"] == 7.0


def test_unparseable_reply_is_flagged_not_zero(recorder) -> None:
    _, url = recorder([(200, completion("I cannot decide."))])
    grade = build_grader(SCORE, judge=judge_cfg(url)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert grade.error == "model_grader_parse_error"
    assert math.isnan(grade.score)


def test_refusal_is_flagged(recorder) -> None:
    _, url = recorder([(200, completion(None, refusal="I won't grade this."))])
    grade = build_grader(SCORE, judge=judge_cfg(url)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert grade.error == "model_grader_refusal_error"


def test_server_errors_retried_then_flagged(recorder) -> None:
    rec, url = recorder([(502, "bad gateway")])
    grade = build_grader(SCORE, judge=judge_cfg(url, retries=2)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert grade.error == "model_grader_server_error"
    assert len(rec.requests) == 3


def test_400_suggests_turning_structured_output_off(recorder) -> None:
    rec, url = recorder([(400, "response_format not supported")])
    grade = build_grader(SCORE, judge=judge_cfg(url)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert grade.error == "model_grader_server_error"
    assert "structured_output: false" in grade.metrics["error_details"]
    _, url2 = recorder([(200, completion("0.4"))])
    rec2_grade = build_grader(SCORE, judge=judge_cfg(url2, structured_output=False)).grade(
        sample_from_text("a"), {"reference_answer": "b"}
    )
    assert rec2_grade.score == 0.4


def test_label_model(recorder) -> None:
    rec, url = recorder(
        [(200, completion('{"steps": [], "result": "good"}')), (200, completion("Label: bad."))]
    )
    g = build_grader(LABEL, judge=judge_cfg(url))
    first, second = g.grade(sample_from_text("nice"), {}), g.grade(sample_from_text("meh"), {})
    assert (first.score, first.metrics["label"]) == (1.0, "good")
    assert (second.score, second.metrics["label"]) == (0.0, "bad")
    body = rec.requests[0]["body"]
    assert body["messages"][0]["role"] == "system"  # developer is sent as system
    assert body["messages"][1]["content"] == "Text: nice"
    assert body["response_format"]["json_schema"]["schema"]["properties"]["result"]["enum"] == [
        "good",
        "bad",
    ]


def test_parsers() -> None:
    assert parse_score('```json\n{"steps": [], "result": 0.25}\n```') == 0.25
    assert parse_score("Score: 3/5") == 3.0
    assert parse_score("no digits") is None
    assert parse_label('{"result": "GOOD"}', ["good", "bad"]) == "good"
    assert parse_label("bad", ["good", "bad"]) == "bad"
    assert parse_label("It is not good, it is bad", ["good", "bad"]) == "good"  # first named
    assert parse_label("goodish", ["good", "bad"]) is None


def test_validation_errors() -> None:
    with pytest.raises(ConfigError, match=r"passing_labels \['great'\] are not among labels"):
        build_grader({**LABEL, "passing_labels": ["great"]}, check_resources=False)
    with pytest.raises(ConfigError, match="range must be"):
        build_grader({**SCORE, "range": [1, 0]}, check_resources=False)
    with pytest.raises(
        ConfigError, match=r"grader\.input\[0\]\.content: content of type 'input_image'"
    ):
        build_grader(
            {
                **SCORE,
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            },
            check_resources=False,
        )
    with pytest.raises(
        ConfigError,
        match=r"grader\.model: model 'o4-mini-2025-04-16' is not available locally.*agentrft\.judge\.base_url",
    ):
        build_grader(SCORE)  # no endpoint and no local model of that name


def test_missing_api_key_variable_fails_at_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$NO_SUCH_KEY, which is not set"):
        build_grader(
            SCORE, judge={"base_url": "http://127.0.0.1:1/v1", "api_key_env": "NO_SUCH_KEY"}
        )


def test_fact_recall_judged_per_fact(recorder) -> None:
    rec, url = recorder(
        [(200, completion('{"result": "yes"}')), (200, completion('{"result": "no"}'))]
    )
    g = build_grader(
        {
            "type": "fact_recall",
            "name": "facts",
            "reference": "{{item.facts}}",
            "judge": {
                "type": "label_model",
                "model": "judge",
                "input": [
                    {"role": "user", "content": "Does '{{sample.output_text}}' state: {{fact}}?"}
                ],
                "labels": ["yes", "no"],
                "passing_labels": ["yes"],
            },
        },
        judge=judge_cfg(url),
    )
    grade = g.grade(
        sample_from_text("Paris is the capital."), {"facts": ["capital is Paris", "population 2M"]}
    )
    assert grade.error is None
    assert grade.score == 0.5
    prompts = sorted(r["body"]["messages"][-1]["content"] for r in rec.requests)
    assert prompts == [
        "Does 'Paris is the capital.' state: capital is Paris?",
        "Does 'Paris is the capital.' state: population 2M?",
    ]


def test_fact_namespace_only_inside_fact_recall() -> None:
    with pytest.raises(ConfigError, match="unknown namespace 'fact'"):
        build_grader(
            {**SCORE, "input": [{"role": "user", "content": "{{fact}}"}]}, check_resources=False
        )
