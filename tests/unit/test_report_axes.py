"""The report's reward chart plots rewards only: `reward/n` (the number of graded rollouts)
once shared the axis and flattened every real curve to the bottom."""

from __future__ import annotations

from agentrft.evaluate.report import is_reward_key, reward_curves


def test_only_rewards_share_the_reward_axis() -> None:
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "reward/std": 0.4,
            "reward/n": 16,
            "eval/reward/mean": 0.2,
            "eval/reward/n": 8,
            "sub_rewards/answer": 0.3,
            "zero_signal_groups": 2,
            "groups/zero_signal": 1,
            "rollouts/discarded": 0,
        }
        for s in range(1, 4)
    ]
    curves = reward_curves(rows)
    assert list(curves) == ["eval/reward/mean", "reward/mean", "sub_rewards/answer"]
    values = [y for points in curves.values() for _, y in points]
    assert max(values) <= 1.0  # one quantity on the axis: nothing on a count's scale
    assert curves["reward/mean"] == [(1, 0.1), (2, 0.2), (3, 0.30000000000000004)]


def test_reward_keys() -> None:
    assert (
        is_reward_key("reward")
        and is_reward_key("eval/reward/mean")
        and is_reward_key("sub_rewards/f1")
    )
    for key in (
        "reward/n",
        "reward/std",
        "eval/reward/n",
        "reward_histogram/3",
        "grader_errors/other_error",
    ):
        assert not is_reward_key(key), key
