"""Group-relative advantages. Pure functions, no I/O.

Each row's G rollouts form a group; a rollout's advantage is its reward relative to its
group. A group whose rewards are all equal carries no signal and is skipped. Discarded
rollouts (tool or grader failures) have no reward (NaN here) and never enter the statistics.
"""

from __future__ import annotations

import torch

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
