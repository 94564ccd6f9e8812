"""The GRPO-family policy-gradient loss over sampled tokens. Pure tensor code.

Variants (all token-level: every sampled token of the batch weighs the same):
- grpo:    std-normalised group advantages, symmetric ratio clipping, token mean.
- dr_grpo: mean-centred advantages (no std), loss summed over tokens and divided by a
           constant (rollouts x max tokens), so long replies carry no length bias.
- dapo:    std-normalised advantages, asymmetric ("clip-higher") clipping, token mean.

With one optimisation pass per batch the "old" log-probs are the current ones detached, so
the ratio is 1 and the clipped objective reduces to the plain policy gradient; with several
passes they come from a no-grad forward before the first pass (PPO).

Truncated importance sampling (`tis_cap` > 0): the tokens were drawn by the engine, whose
log-probs differ from the trainer's (another kernel, dtype or process: vLLM). Each token's
loss is weighted by min(p_old / p_engine, tis_cap), detached, so the gradient is that of the
trainer's own policy, with the variance bounded by the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    variant: str = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    tis_cap: float = 0.0  # 0: no importance correction for the engine's drift


@dataclass(frozen=True)
class LossParts:
    loss: torch.Tensor  # scalar, already divided by the step's normaliser
    clipped_tokens: torch.Tensor  # count of tokens whose ratio was clipped
    kl_sum: torch.Tensor  # sum over tokens of the k3 KL estimate (0 without a reference)
    tis_weight_sum: torch.Tensor  # sum over tokens of the importance weights (N without TIS)
    tis_capped: torch.Tensor  # count of tokens whose weight was cut to the cap


def policy_loss(
    logp_N: torch.Tensor,
    old_logp_N: torch.Tensor,
    adv_N: torch.Tensor,
    normalizer: float,
    cfg: LossConfig,
    ref_logp_N: torch.Tensor | None = None,
    engine_logp_N: torch.Tensor | None = None,
) -> LossParts:
    """Loss over N sampled tokens (flattened across rollouts). `adv_N` is each token's
    rollout advantage; `normalizer` is the step-wide divisor (total sampled tokens for
    grpo/dapo, rollouts x max tokens for dr_grpo), so gradient accumulation over micro-batches
    sums to exactly the full-batch gradient. `engine_logp_N`: the log-probs the engine
    sampled with, for truncated importance sampling (`cfg.tis_cap`)."""
    ratio = torch.exp(logp_N - old_logp_N)
    unclipped = ratio * adv_N
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv_N
    per_token = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).detach()
    kl_sum = torch.zeros((), device=logp_N.device)
    if ref_logp_N is not None:
        delta = ref_logp_N - logp_N
        kl = torch.exp(delta) - delta - 1.0  # k3: unbiased, always >= 0
        per_token = per_token + cfg.kl_coef * kl
        kl_sum = kl.detach().sum()
    weight = torch.ones_like(per_token)
    capped = torch.zeros((), device=logp_N.device)
    if cfg.tis_cap > 0 and engine_logp_N is not None:
        raw = torch.exp(old_logp_N.detach() - engine_logp_N)
        weight = torch.clamp(raw, max=cfg.tis_cap).detach()
        capped = (raw > cfg.tis_cap).sum()
        per_token = per_token * weight
    return LossParts(per_token.sum() / normalizer, was_clipped.sum(), kl_sum, weight.sum(), capped)
