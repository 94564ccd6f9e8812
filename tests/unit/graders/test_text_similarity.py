"""text_similarity: every metric, computed by its library, on cases with known ordering.
(cosine loads an embedding model and is tested in tests/integration.)"""

from __future__ import annotations

from typing import get_args

import pytest

from agentrft.graders import build_grader, sample_from_text
from agentrft.graders.text_similarity import Metric, similarity

REF = "the quick brown fox jumps over the lazy dog"
CLOSE = "the quick brown fox jumps over the lazy cat"
FAR = "stock prices fell sharply on monday morning"

LEXICAL = [m for m in get_args(Metric) if m != "cosine"]  # every metric but the model one


def grade(metric: str, output: str, reference: str, **extra: object):
    g = build_grader(
        {
            "type": "text_similarity",
            "name": "t",
            "input": "{{sample.output_text}}",
            "reference": "{{item.ref}}",
            "evaluation_metric": metric,
            **extra,
        }
    )
    return g.grade(sample_from_text(output), {"ref": reference})


@pytest.mark.parametrize("metric", LEXICAL)
def test_identical_close_far(metric: str) -> None:
    same, close, far = (grade(metric, t, REF) for t in (REF, CLOSE, FAR))
    assert all(g.error is None for g in (same, close, far))
    assert same.score == pytest.approx(1.0, abs=0.01)
    assert 0.0 <= far.score < close.score < same.score + 1e-9
    assert far.score < 0.5


def test_known_values() -> None:
    # rouge_1 F: 8 of 9 unigrams shared each way
    assert similarity("rouge_1", CLOSE, REF) == pytest.approx(8 / 9)
    # rouge_5: 4 of the 5 five-grams shared
    assert similarity("rouge_5", CLOSE, REF) == pytest.approx(4 / 5)
    assert (
        similarity("fuzzy_match", "Fuzzy Wuzzy", "fuzzy wuzzy!") == 1.0
    )  # default_process lowercases, drops punctuation
    # BLEU: geometric mean of the 1..4-gram precisions 8/9, 7/8, 6/7, 5/6 (no brevity penalty)
    assert similarity("bleu", CLOSE, REF) == pytest.approx((8 / 9 * 7 / 8 * 6 / 7 * 5 / 6) ** 0.25)


def test_meteor_uses_wordnet_synonyms() -> None:
    """With WordNet, a synonym counts as a match (car/auto share a synset); without it
    METEOR would score both hypotheses the same."""
    syn = similarity("meteor", "the red car stopped", "the red auto stopped")
    unrelated = similarity("meteor", "the red xyzzy stopped", "the red auto stopped")
    assert syn == pytest.approx(
        similarity("meteor", "the red auto stopped", "the red auto stopped")
    )
    assert syn > unrelated + 0.3


def test_empty_strings() -> None:
    for metric in LEXICAL:
        assert similarity(metric, "", "") == 1.0
        assert similarity(metric, "", REF) == 0.0
        assert similarity(metric, REF, "  ") == 0.0


def test_pass_threshold_reported_not_applied() -> None:
    g = grade("rouge_1", CLOSE, REF, pass_threshold=0.95)
    assert g.score == pytest.approx(8 / 9)
    assert g.metrics["passed"] is False
