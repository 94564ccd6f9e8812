"""The policy plug point: something that continues token sequences and reports log-probs.

The rollout engine only needs `sample`; the trainer additionally uses the HF backend's model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrft.policy.constrain import ToolCallGrammar


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[
        str, ...
    ] = ()  # stop strings (the text that ends a reply early), kept in the output
    min_tokens: int = 0  # neither a stop token nor a stop string ends a reply before this many tokens (vLLM's min_tokens)
    # the grammar the sampled tokens must follow (`policy.constrain`); log-probs stay those of
    # the model's unmasked distribution, and a token the grammar left alone is marked forced
    constraint: ToolCallGrammar | None = None


def after_prefill(params: SamplingParams, prefill: str | None) -> SamplingParams | None:
    """The parameters of a reply that starts with `prefill`: the same, but a grammar that has
    already read the prefill (it may open a tool call). None when they do not change, so the
    request batches with the rest under the sampler's own parameters."""
    if not prefill or params.constraint is None:
        return None
    return replace(params, constraint=params.constraint.after(prefill))


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...]  # sampled ids, the stop token included when one was produced
    logprobs: tuple[
        float, ...
    ]  # log p(token) under the model's distribution (after temperature, before masks)
    finish_reason: Literal["stop", "length"]
    stop_text: str = (
        ""  # the stop string matched; "" when a stop token ended the reply (or none did)
    )
    # per token, True where a constraint left it the only choice (the grammar wrote it); ()
    # when none was (engines that do not say leave it empty)
    forced: tuple[bool, ...] = ()

    @property
    def ended_by_stop_token(self) -> bool:
        return self.finish_reason == "stop" and not self.stop_text

    @property
    def reply_tokens(self) -> tuple[int, ...]:
        """The reply itself: the sampled tokens without the stop token that ended it."""
        return self.tokens[:-1] if self.ended_by_stop_token else self.tokens


@runtime_checkable
class Policy(Protocol):
    tokenizer: Any
    stop_token_ids: frozenset[int]
    context_window: int

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Continue each prompt (token ids). `max_tokens` optionally caps each row separately.
        `seeds` gives each row its own random stream, so a row's sample does not depend on
        which other rows share its batch (otherwise `params.seed` seeds the whole batch)."""
        ...
