"""Advantages -> **the weight update**: score the sampled tokens of graded rollouts and take
one optimiser step per PPO epoch (`ppo_epochs`, 1 by default).

Only SAMPLED tokens enter the loss: prompt, template, tool output and prefill tokens are
context. Logits are computed only at the positions that predict a sampled token (the
language-model head over the whole sequence would cost far more memory than the model).
Micro-batches bounded by `micro_batch_tokens` accumulate gradients, so a large batch trains
in bounded memory with exactly the full-batch gradient.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrft.policy.precision import bf16_autocast
from agentrft.train.loss import LossConfig, policy_loss
from agentrft.types import Origin, Trajectory


@dataclass(frozen=True)
class UpdateConfig:
    loss: LossConfig
    temperature: float = 1.0
    ppo_epochs: int = 1
    micro_batch_tokens: int = 4096
    max_grad_norm: float = 1.0
    max_tokens_per_episode: int = 1024  # dr_grpo's constant normaliser
    bf16: bool = True


@dataclass(frozen=True)
class Scored:
    """One rollout ready for the update: its context and which tokens to score."""

    tokens: list[int]
    targets: list[int]  # positions t (>= 1) whose token was sampled
    sampler_logp: list[float]  # log-probs recorded at sampling, aligned with targets
    advantage: float
    group: int = 0  # rollouts of one group share their prompt

    @classmethod
    def from_trajectory(cls, traj: Trajectory, advantage: float, group: int = 0) -> Scored:
        targets = [t for t, o in enumerate(traj.origins) if o == Origin.SAMPLED and t > 0]
        return cls(
            list(traj.tokens), targets, [traj.logprobs[t] for t in targets], advantage, group
        )


MIN_SHARED = 16  # shorter shared prefixes are not worth a separate forward pass


def shared_prefix(items: Sequence[Scored]) -> int:
    """How many leading tokens all `items` share (at most the shortest length - 1), or 0
    when that is under MIN_SHARED."""
    if len(items) < 2:
        return 0
    first, limit = items[0].tokens, min(len(it.tokens) for it in items) - 1
    p = 0
    while p < limit and all(it.tokens[p] == first[p] for it in items[1:]):
        p += 1
    return p if p >= MIN_SHARED else 0


def micro_batches(items: Sequence[Scored], max_tokens: int) -> list[list[int]]:
    """Indices of rollouts to score together: a group's rollouts stay together (their shared
    prompt is computed once), split so that the tokens computed, the prefix once plus each
    row's own suffix (token_logprobs pads none), stay <= max_tokens; rows without a shared
    prompt run in one padded batch, so each counts as long as the longest."""
    groups: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.group, []).append(i)
    batches: list[list[int]] = []
    for members in groups.values():
        prefix = shared_prefix([items[i] for i in members])
        current: list[int] = []
        size = 0
        for i in sorted(members, key=lambda i: -len(items[i].tokens)):
            own = len(items[i].tokens) - prefix
            if prefix == 0 and current:  # no shared prompt: padded to the longest, the first
                own = len(items[current[0]].tokens)
            if current and prefix + size + own > max_tokens:
                batches.append(current)
                current, size = [], 0
            current.append(i)
            size += own
        batches.append(current)
    return batches


def _parts(model: Any) -> tuple[Any, Any]:
    """(decoder backbone, output head) of a causal LM, through a peft wrapper if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def token_logprobs(
    model: Any, items: Sequence[Scored], temperature: float, bf16: bool, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of every target token of `items`, flattened in
    order; logits only at the positions that predict a target.

    When the items share a prompt (a group), it is run once and its keys and values are
    given to every row (gradients flow back through them from all of them, exactly as if
    each row had its own copy); then each row's own suffix is run on its own, so no row is
    padded to the longest (in a group, a rollout that stopped at its first call sits beside
    one that made five)."""
    decoder, head = _parts(model)
    device = next(model.parameters()).device
    prefix = shared_prefix(items)
    tgt = torch.tensor([it.tokens[t] for it in items for t in it.targets], device=device)
    with bf16_autocast(bf16, device):
        if prefix:
            hidden = _suffix_hidden(decoder, items, prefix, device)
        else:
            hidden = _padded_hidden(decoder, items, device)
        logits = head(hidden)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, tgt[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def _padded_hidden(decoder: Any, items: Sequence[Scored], device: torch.device) -> torch.Tensor:
    """The hidden states that predict the targets, rows right-padded into one batch."""
    width = max(len(it.tokens) for it in items)
    ids = torch.zeros((len(items), width), dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    rows, cols = [], []
    for b, it in enumerate(items):
        ids[b, : len(it.tokens)] = torch.tensor(it.tokens)
        mask[b, : len(it.tokens)] = 1
        rows += [b] * len(it.targets)
        cols += [t - 1 for t in it.targets]  # position t-1 predicts token t
    hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    return hidden[torch.tensor(rows), torch.tensor(cols)]


def _suffix_hidden(
    decoder: Any, items: Sequence[Scored], prefix: int, device: torch.device
) -> torch.Tensor:
    """The hidden states that predict the targets: the shared `prefix` once, then each row's
    suffix on its own, reading the prefix's keys and values."""
    from transformers import DynamicCache

    cache = DynamicCache()
    head_ids = torch.tensor([items[0].tokens[:prefix]], device=device)
    shared = decoder(input_ids=head_ids, cache=cache, use_cache=True).last_hidden_state[0]
    one = torch.zeros(1, dtype=torch.long, device=device)
    picked = []
    for it in items:
        own = shared[:0]
        if len(it.tokens) > prefix:
            # the prefix's cache for this row: its layers copied (whatever their kind), each
            # reading the prefix's keys and values through a differentiable copy
            row_cache = copy.copy(cache)
            row_cache.layers = [copy.copy(layer) for layer in cache.layers]
            row_cache.reorder_cache(one)  # type: ignore[arg-type]
            own = decoder(
                input_ids=torch.tensor([it.tokens[prefix:]], device=device),
                position_ids=torch.arange(prefix, len(it.tokens), device=device)[None],
                cache=row_cache,
                use_cache=True,
            ).last_hidden_state[0]
        cols = torch.tensor([t - 1 for t in it.targets], device=device)  # t-1 predicts t
        picked.append(torch.cat([shared, own])[cols])
    return torch.cat(picked)


@contextlib.contextmanager
def reference_model(model: Any) -> Iterator[Any]:
    """The reference policy: with LoRA, the same model with its adapter switched off."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield model
    else:
        raise ValueError(
            "kl_coef > 0 needs a reference; with full fine-tuning that is not supported yet (use LoRA)"
        )


def update_policy(
    model: Any, optimizer: torch.optim.Optimizer, items: Sequence[Scored], cfg: UpdateConfig
) -> dict[str, float]:
    """One RL update on `items` (rollouts with non-zero advantage). Returns metrics."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    n_tokens = sum(len(it.targets) for it in items)
    if not items or n_tokens == 0:
        return {"update/skipped": 1.0}
    normalizer = (
        float(len(items) * cfg.max_tokens_per_episode)
        if cfg.loss.variant == "dr_grpo"
        else float(n_tokens)
    )
    batches = micro_batches(items, cfg.micro_batch_tokens)

    def flat(values: Sequence[float] | list[list[float]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    model.eval()
    old: dict[int, torch.Tensor] = {}
    ref: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for k, idx in enumerate(batches):
            sub = [items[i] for i in idx]
            if cfg.ppo_epochs > 1:
                old[k] = token_logprobs(model, sub, cfg.temperature, cfg.bf16)[0]
            if cfg.loss.kl_coef > 0:
                with reference_model(model) as ref_model:
                    ref[k] = token_logprobs(ref_model, sub, cfg.temperature, cfg.bf16)[0]
    model.train()
    stats = {
        "loss": 0.0,
        "clipped": 0.0,
        "kl": 0.0,
        "entropy": 0.0,
        "sampler_drift": 0.0,
        "sampler_kl": 0.0,
        "tis_weight": 0.0,
        "tis_capped": 0.0,
        "grad_norm": 0.0,
    }
    for epoch in range(cfg.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for k, idx in enumerate(batches):
            sub = [items[i] for i in idx]
            logp, entropy = token_logprobs(
                model, sub, cfg.temperature, cfg.bf16, with_entropy=epoch == 0
            )
            adv = flat([it.advantage for it in sub for _ in it.targets])
            old_logp = old[k] if cfg.ppo_epochs > 1 else logp.detach()
            engine_logp = flat([lp for it in sub for lp in it.sampler_logp])
            parts = policy_loss(logp, old_logp, adv, normalizer, cfg.loss, ref.get(k), engine_logp)
            parts.loss.backward()
            stats["loss"] += float(parts.loss.detach()) / cfg.ppo_epochs
            if epoch == cfg.ppo_epochs - 1:
                stats["clipped"] += float(parts.clipped_tokens)
                stats["kl"] += float(parts.kl_sum)
                stats["tis_weight"] += float(parts.tis_weight_sum)
                stats["tis_capped"] += float(parts.tis_capped)
            if epoch == 0:
                assert entropy is not None
                stats["entropy"] += float(entropy.detach().sum())
                # the engine check: how far the sampler's log-probs are from the trainer's
                delta = logp.detach() - engine_logp
                stats["sampler_drift"] += float(delta.abs().sum())
                # k3 estimate of KL(engine || trainer) on the engine's samples
                stats["sampler_kl"] += float((torch.exp(delta) - delta - 1.0).sum())
        params = [p for p in model.parameters() if p.requires_grad]
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        optimizer.step()
    model.eval()
    return {
        "train/loss": stats["loss"],
        "train/entropy": stats["entropy"] / n_tokens,
        "train/clip_fraction": stats["clipped"] / n_tokens,
        "train/kl": stats["kl"] / n_tokens,
        # mean |trainer - engine| log-prob of the sampled tokens, and KL(engine || trainer)
        "engine/logprob_gap": stats["sampler_drift"] / n_tokens,
        "engine/kl": stats["sampler_kl"] / n_tokens,
        "train/tis_weight": stats["tis_weight"] / n_tokens,
        "train/tis_capped_fraction": stats["tis_capped"] / n_tokens,
        "train/grad_norm": stats["grad_norm"],
        "train/tokens": float(n_tokens),
        "train/rollouts": float(len(items)),
        "train/micro_batches": float(len(batches)),
        "time/update_s": time.perf_counter() - t0,
    }
