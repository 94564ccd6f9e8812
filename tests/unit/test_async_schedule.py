"""The async pipeline's bookkeeping: adapter names to versions, and a batch older than
max_staleness is never trained on (its rollouts are discarded with the reason, and counted)."""

from __future__ import annotations

import pytest

from agentrft.engine import adapter_version
from agentrft.train.async_steps import drop_stale
from agentrft.train.step import Batch, check_failures
from agentrft.types import Group, Item, StopReason, Trajectory


def test_adapter_names_map_to_versions():
    assert adapter_version("base") == 0
    assert adapter_version("step-4") == 4
    assert adapter_version("step-12-1a2b3c") == 12
    with pytest.raises(ValueError, match="no training adapter name"):
        adapter_version("eval")


def trajectory(i: int) -> Trajectory:
    return Trajectory(
        f"t{i}", Item(0, (), {}, "rows.jsonl:1"), (), (), (), (), (), StopReason.FINAL_ANSWER
    )


def batch(sampled_with: str) -> Batch:
    groups = [Group(Item(0, (), {}, "rows.jsonl:1"), (trajectory(0), trajectory(1)))]
    return Batch(5, groups, sampler=None, sampled_with=sampled_with, stats={})  # type: ignore[arg-type]


def test_a_batch_within_max_staleness_is_kept():
    kept, dropped = drop_stale(batch("step-4"), 5, 1)
    assert dropped == 0 and all(not t.discarded for g in kept.groups for t in g.trajectories)


def test_a_batch_older_than_max_staleness_is_discarded_with_the_reason():
    old, dropped = drop_stale(batch("step-3"), 5, 1)
    assert dropped == 2
    reasons = {t.discarded for g in old.groups for t in g.trajectories}
    assert len(reasons) == 1
    assert "sampled with step-3, 2 updates before the update of step 6" in reasons.pop()
    # a step made only of stale rollouts aborts with that reason rather than train on them
    with pytest.raises(Exception, match="max_staleness 1"):
        check_failures(old.groups, 6, 0.5)
