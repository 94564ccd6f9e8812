"""The check, every step, that the rollouts were sampled from the policy being trained.

Two signals, both in the step's metrics beside reward:
- **identity**: every reply must come from the adapter the step asked for
  (`engine/wrong_adapter` is 0; the vLLM engine counts replies whose `model` differs);
- **numbers**: the trainer recomputes the sampled tokens' log-probs in the update;
  `engine/logprob_gap` is the mean |trainer - engine| and `engine/kl` a k3 estimate of
  KL(engine || trainer). On the local engine in fp32 they are 0; bf16 kernels give a few
  hundredths; a stale adapter, another dtype or a template that renders other tokens gives
  more.

Past `agentrft.engine_check.warn_gap` the step warns; past `stop_gap` (or with any wrong
adapter) the run stops with EngineMismatch, naming the likely causes. A step of async
training whose rollouts were sampled with older weights (`staleness` above 0) has a gap that
also holds the policy's own change since then, so its numbers only warn, past `stop_gap`;
its identity check, and the numbers of every on-policy step, stop the run as above. There is no switch to
turn it off: raise the thresholds if a model's kernels really differ that much.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentrft.console import console
from agentrft.errors import EngineMismatch
from agentrft.job import EngineCheck

CAUSES = (
    "the engine is not sampling with the trainer's weights: an adapter sync that did not "
    "load (or loaded the old files), a server restarted on the base model, a different "
    "dtype or model directory on the engine, or a chat template that renders other tokens "
    "than the ones trained on"
)


def check_engine(
    metrics: Mapping[str, float],
    cfg: EngineCheck,
    step: int,
    engine: str,
    adapter: str,
    staleness: int = 0,
) -> str | None:
    """Warn or stop on the step's engine metrics; returns the warning printed, if any."""
    wrong = metrics.get("engine/wrong_adapter", 0.0)
    if wrong:
        raise EngineMismatch(
            f"step {step}: {int(wrong)} replies came from another adapter than {adapter!r} "
            f"({engine} engine). Likely cause: {CAUSES}."
        )
    gap = metrics.get("engine/logprob_gap")
    if gap is None:  # no sampled token was trained on this step (no group had signal)
        return None
    kl = metrics.get("engine/kl", 0.0)
    what = (
        f"step {step}: the {engine} engine's log-probs of the sampled tokens are "
        f"{gap:.3f} from the trainer's on average (KL {kl:.4f}), sampled with {adapter!r}"
    )
    if staleness > 0:
        if gap <= cfg.stop_gap:
            return None
        msg = (
            f"{what}, {staleness} update(s) before the trainer's weights: above "
            f"agentrft.engine_check.stop_gap {cfg.stop_gap:g}. Part of it is the policy's own "
            f"change since then (a learning rate that moves it this far makes async steps "
            f"far off-policy), part may be: {CAUSES}"
        )
        console.print(f"[yellow]warning[/] {msg}")
        return msg
    if gap > cfg.stop_gap:
        raise EngineMismatch(
            f"{what}: above agentrft.engine_check.stop_gap {cfg.stop_gap:g}, so training "
            f"would be off-policy. Likely cause: {CAUSES}."
        )
    if gap > cfg.warn_gap:
        msg = f"{what}: above agentrft.engine_check.warn_gap {cfg.warn_gap:g}"
        console.print(f"[yellow]warning[/] {msg}")
        return msg
    return None
