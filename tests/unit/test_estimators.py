"""pass@k and best-of-k against brute-force enumeration of every k-subset."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrft.evaluate.estimators import best_of_k, best_of_k_curve, pass_at_k, rewards_by_prompt


def brute_best_of_k(rewards: list[float], k: int) -> float:
    subsets = list(itertools.combinations(rewards, k))
    return sum(max(s) for s in subsets) / len(subsets)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(-5, 5, allow_nan=False) | st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=9
    ),
    st.data(),
)
def test_best_of_k_matches_enumeration(rewards: list[float], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(rewards)))
    assert best_of_k(rewards, k) == pytest.approx(brute_best_of_k(rewards, k), abs=1e-9)


def test_best_of_k_with_binary_rewards_is_pass_at_k() -> None:
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 40)
        outcomes = [float(rng.random() < 0.3) for _ in range(n)]
        k = rng.randint(1, n)
        assert best_of_k(outcomes, k) == pytest.approx(
            pass_at_k(n, int(sum(outcomes)), k), abs=1e-12
        )


def test_edges_and_monotonicity() -> None:
    rewards = [0.1, 0.9, 0.4, 0.4, 0.0]
    assert best_of_k(rewards, 1) == pytest.approx(sum(rewards) / len(rewards))
    assert best_of_k(rewards, len(rewards)) == pytest.approx(max(rewards))
    curve = [best_of_k(rewards, k) for k in range(1, 6)]
    assert curve == sorted(curve)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # fewer than k wrong samples: every subset has a hit
    for bad in [(3, 1, 0), (3, 1, 4), (3, 4, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_stable_for_hundreds_of_samples() -> None:
    """C(500, 250) is ~1e149: a float formula overflows or cancels; the exact one does not."""
    n, c = 500, 3
    for k in (1, 10, 100, 250, 498, 500):
        expected = 1.0 - math.prod((n - c - j) / (n - j) for j in range(k))  # the product form
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    rng = random.Random(1)
    rewards = [rng.random() for _ in range(400)]
    values = [best_of_k(rewards, k) for k in (1, 2, 50, 200, 399, 400)]
    assert values[0] == pytest.approx(sum(rewards) / 400)
    assert values[-1] == pytest.approx(max(rewards))
    assert all(math.isfinite(v) for v in values) and values == sorted(values)


def test_curve_from_rollout_records() -> None:
    records = [
        {"row": 0, "reward": 0.0, "discarded": None},
        {"row": 0, "reward": 1.0, "discarded": None},
        {"row": 0, "reward": 1.0, "discarded": "tool x unavailable"},  # kept out
        {"row": 1, "reward": 0.5, "discarded": None},
        {"row": 1, "reward": 0.5, "discarded": None},
        {"row": 1, "reward": None, "discarded": None},  # ungraded: kept out
    ]
    groups = rewards_by_prompt(records)
    assert sorted(map(sorted, groups)) == [[0.0, 1.0], [0.5, 0.5]]
    curve = best_of_k_curve(groups)
    assert curve == {1: pytest.approx((0.5 + 0.5) / 2), 2: pytest.approx((1.0 + 0.5) / 2)}
    assert best_of_k_curve(groups, ks=[1, 5]) == {1: pytest.approx(0.5)}
    assert best_of_k_curve([]) == {}


def test_row_means_average_a_rows_graded_rollouts_and_skip_failures():
    from agentrft.evaluate.estimators import row_means

    recs = [
        {"row": 0, "reward": 1.0, "grade": {"sub_scores": {"files": 0.5}}},
        {"row": 0, "reward": 0.0, "grade": {"sub_scores": {"files": 0.0}}},
        {"row": 1, "reward": 0.3, "grade": {"sub_scores": {"files": 1.0}}},
        {"row": 1, "reward": 0.9, "discarded": True, "grade": None},
        {
            "row": 1,
            "reward": 0.9,
            "grade": {"error": "python_grader_runtime_error", "sub_scores": {}},
        },
    ]
    assert row_means(recs) == {0: 0.5, 1: 0.3}
    assert row_means(recs, "files") == {0: 0.25, 1: 1.0}


def test_paired_difference_is_a_t_interval_around_the_mean():
    from agentrft.evaluate.estimators import paired_difference

    d = paired_difference([0.1, 0.2, 0.3, 0.4])
    assert d.mean == pytest.approx(0.25) and d.n == 4
    # sd = 0.1291, t(0.975, 3) = 3.1824: half-width 0.2054
    assert d.low == pytest.approx(0.25 - 0.2054, abs=1e-3) and d.high == pytest.approx(
        0.25 + 0.2054, abs=1e-3
    )
    assert paired_difference([0.2] * 5).low == pytest.approx(0.2)  # no spread, no width
    assert "95% interval" in str(d)
    with pytest.raises(ValueError):
        paired_difference([])
