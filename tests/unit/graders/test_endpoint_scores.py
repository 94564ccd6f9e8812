"""endpoint grader replies that are not a verdict: a score outside the grader's `range`, or
a sub-score that is NaN, infinite or not a number, flags the sample (never clipped, never
scored); a widened `range` accepts penalties."""

from __future__ import annotations

import math

import pytest

from agentrft.errors import ConfigError
from agentrft.graders import build_grader, sample_from_text


def grade_reply(recorder, body: object, **extra: object):
    rec, url = recorder([(200, body)])
    g = build_grader(
        {"type": "endpoint", "name": "env", "url": f"{url}/grade", "backoff_s": 0.0, **extra}
    )
    return g.grade(sample_from_text("x"), {}, "trace_r"), rec


@pytest.mark.parametrize("score", [5.0, -3.5, 1.0001])
def test_score_outside_the_range_is_flagged(recorder, score: float) -> None:
    grade, rec = grade_reply(recorder, {"score": score})
    assert grade.error == "endpoint_grader_score_error"
    assert "outside the grader's range [0, 1]" in grade.metrics["error_details"]
    assert math.isnan(grade.score)
    assert len(rec.requests) == 1  # a deterministic bug: not retried


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"score": NaN}', "finite"),
        ('{"score": Infinity}', "finite"),
        ('{"score": true}', "must be a number, got bool"),
        ('{"score": "0.9"}', "must be a number, got str"),
        ('{"score": null}', "must be a number, got NoneType"),
        ('{"reward": 1.0}', 'no "score" (keys: reward)'),
    ],
)
def test_a_reply_that_can_never_be_valid_is_flagged_on_the_first_attempt(
    recorder, body: str, says: str
) -> None:
    grade, rec = grade_reply(recorder, body)
    assert grade.error == "endpoint_grader_score_error"
    assert says in grade.metrics["error_details"]
    assert math.isnan(grade.score)
    assert len(rec.requests) == 1  # not retried 3 more times


@pytest.mark.parametrize("sub", ["NaN", "Infinity", "-Infinity", '"high"', "true", "null"])
def test_bad_sub_scores_are_flagged(recorder, sub: str) -> None:
    grade, _ = grade_reply(
        recorder, '{"score": 0.5, "sub_scores": {"tests": 1.0, "style": ' + sub + "}}"
    )
    assert grade.error == "endpoint_grader_score_error"
    assert "style" in grade.metrics["error_details"]
    assert math.isnan(grade.score)


def test_a_widened_range_accepts_penalties(recorder) -> None:
    grade, _ = grade_reply(recorder, {"score": -1.0, "sub_scores": {"budget": -1.0}}, range=[-1, 1])
    assert grade.error is None
    assert grade.score == -1.0
    assert grade.sub_scores == {"budget": -1.0}


def test_range_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="range"):
        build_grader({"type": "endpoint", "url": "http://127.0.0.1:9/grade", "range": [1, 0]})
