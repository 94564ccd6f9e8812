"""Grades -> **group-relative advantages** -> update. Pure functions, no I/O.

Each row's G rollouts form a group; a rollout's advantage is its reward relative to its
group. A group whose rewards are all equal carries no signal and is skipped. Discarded
rollouts (tool or grader failures) have no reward (NaN here) and never enter the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from agentrft.graders.groups import reward_of
from agentrft.train.update import Scored
from agentrft.types import Group

EPS = 1e-6


def group_advantages(rewards_G: torch.Tensor, normalize_std: bool = True) -> torch.Tensor:
    """Advantages for one group. NaN rewards (discarded rollouts) get NaN advantages and are
    left out of the mean/std. GRPO divides by the group std; Dr.GRPO only centres."""
    kept = ~torch.isnan(rewards_G)
    if int(kept.sum()) < 2:
        return torch.full_like(rewards_G, float("nan"))
    r = rewards_G[kept]
    adv = rewards_G - r.mean()
    if normalize_std:
        adv = adv / (r.std(unbiased=False) + EPS)
    return adv


def has_signal(rewards_G: torch.Tensor, tol: float = 1e-9) -> bool:
    """False when the kept rewards are all equal (or fewer than two are kept)."""
    r = rewards_G[~torch.isnan(rewards_G)]
    return r.numel() >= 2 and float(r.max() - r.min()) > tol


def rollouts_with_advantage(
    groups: Sequence[Group], normalize_std: bool
) -> tuple[list[Scored], dict[str, float]]:
    """The rollouts of graded groups that carry a non-zero advantage, ready for the update,
    and how many groups had signal. Discarded and failed-grade rollouts (NaN reward) never
    enter the group statistics."""
    scored: list[Scored] = []
    zero_signal = 0
    for k, g in enumerate(groups):
        rewards = torch.tensor([reward_of(gr) for gr in g.grades], dtype=torch.float64)
        if not has_signal(rewards):
            zero_signal += 1
            continue
        for traj, adv in zip(
            g.trajectories, group_advantages(rewards, normalize_std).tolist(), strict=True
        ):
            if not math.isnan(adv) and adv != 0.0:
                scored.append(Scored.from_trajectory(traj, adv, group=k))
    return scored, {
        "groups/zero_signal": float(zero_signal),
        "groups/with_signal": float(len(groups) - zero_signal),
    }
