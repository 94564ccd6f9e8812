"""The job's training settings: the loss variant and its clip range, whether advantages are
normalised by the group's reward std, and the weight update's settings. The training loop
builds them here from the job, as agentrft.runtime builds the rollout's."""

from __future__ import annotations

from agentrft.job import Job
from agentrft.train.loss import LossConfig
from agentrft.train.update import UpdateConfig

DAPO_CLIP_HIGH = 0.28  # DAPO's "clip-higher" (Yu et al., 2025): room for rare tokens to grow


TIS_CAP_DEFAULT = 2.0  # truncated importance sampling's cap where it is on by default


def loss_config(job: Job, engine: str = "local", off_policy: bool = False) -> LossConfig:
    """The loss variant and its clip range. `clip_high` unset: DAPO's 0.28 for `dapo`, else
    symmetric (= clip_low). `tis_cap` unset: on (2.0) with the vLLM engine, whose log-probs
    come from other kernels than the trainer's, and for async steps (`off_policy`), whose
    rollouts were sampled with older weights; off otherwise."""
    t = job.agentrft.train
    clip_high = (
        t.clip_high
        if t.clip_high is not None
        else (DAPO_CLIP_HIGH if t.loss == "dapo" else t.clip_low)
    )
    default = TIS_CAP_DEFAULT if engine == "vllm" or off_policy else 0.0
    tis = t.tis_cap if t.tis_cap is not None else default
    return LossConfig(t.loss, t.clip_low, clip_high, t.kl_coef, tis)


def normalize_std(job: Job) -> bool:
    """Whether advantages are divided by the group's reward std: not in Dr. GRPO, which drops
    that term (it over-weights groups whose rewards barely differ)."""
    return job.agentrft.train.loss != "dr_grpo"


def update_config(
    job: Job, bf16: bool, engine: str = "local", off_policy: bool = False
) -> UpdateConfig:
    """The weight update's settings. `bf16`: autocast the update, as the loaded policy does
    (the job's `dtype`, resolved for this hardware)."""
    ext = job.agentrft
    return UpdateConfig(
        loss=loss_config(job, engine, off_policy),
        # log-probs are scored at the temperature they were sampled at (greedy: 1.0)
        temperature=ext.sampling.temperature if ext.sampling.temperature > 0 else 1.0,
        ppo_epochs=ext.train.ppo_epochs,
        micro_batch_tokens=ext.train.micro_batch_tokens,
        max_grad_norm=ext.train.max_grad_norm,
        max_tokens_per_episode=ext.sampling.max_tokens_per_episode,
        bf16=bf16,
    )
