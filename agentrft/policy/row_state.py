"""One sampled row's decoding state, shared by both sampling loops.

`HFPolicy.sample` (a static batch: rollouts) and `serve.running_batch` (continuous batching:
serve-model) decode rows the same way, and this module is that way, written once:

    rules.start(row) -> m = rules.mask(logits, rows) -> choose -> rules.record(rows, tok, logp, m) -> ...

- `mask` edits the next-token logits in place before a token is chosen: a row under
  `min_tokens` may not stop (its stop tokens get -inf), and a row with a grammar
  (`SamplingParams.constraint`, see `policy.constrain`) may only take a token its grammar
  allows. The log-prob recorded for the chosen token is of the model's own distribution
  before the mask (at the row's temperature), the one a trainer recomputes from the weights,
  so the engine check compares like with like. A token that was the only one the mask left
  is recorded as `forced`: the grammar wrote it, the model chose nothing there, so the
  rollout marks it `Origin.FORCED` and training leaves it alone (with a negative advantage,
  training on it pushed the model off the tool-call syntax it is made to write).
- `record` appends each chosen token, advances the row's grammar, and ends the row on a stop
  token, a stop string (searched in the last `tail` tokens' text) or its token limit.

A row with a grammar ignores `min_tokens`: its grammar decides when the reply may end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrft.policy import Completion, SamplingParams


@dataclass(eq=False)
class RowState:
    """The tokens one row has sampled and whether (and why) it has ended."""

    params: SamplingParams
    limit: int  # most tokens this row may sample
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" or "length" once finished
    stop_text: str = ""  # the stop string that ended the row, if one did
    tail: int = 0  # tokens to decode to see a stop string (set by `RowRules.start`)
    matcher: Any = None  # the row's xgrammar GrammarMatcher, when its params have a constraint
    forced: list[bool] = field(default_factory=list)  # per token: the only one the mask left

    def completion(self) -> Completion:
        return Completion(
            tuple(self.tokens),
            tuple(self.logprobs),
            "stop" if self.finish_reason == "stop" else "length",
            self.stop_text,
            tuple(self.forced) if any(self.forced) else (),
        )


@dataclass(frozen=True)
class Masking:
    """What `RowRules.mask` did to a step's logits, per row: the log-normaliser of the
    unmasked distribution at the row's temperature, and whether the mask left one token."""

    logits: torch.Tensor  # the masked logits (an allowed token's logit is unchanged)
    scale: torch.Tensor  # 1 / temperature per row (1 for greedy rows)
    raw_lse: torch.Tensor  # logsumexp of the unmasked logits * scale
    forced: torch.Tensor  # bool per row

    def raw_logprobs(self, tok: torch.Tensor) -> torch.Tensor:
        """The chosen tokens' log-probs under the unmasked distribution."""
        return self.logits.gather(-1, tok[:, None]).squeeze(-1) * self.scale - self.raw_lse


class RowRules:
    """How rows of one policy end and what they may sample: its tokenizer, stop tokens and
    vocabulary (the width of its logits)."""

    def __init__(
        self, tokenizer: Any, stop_token_ids: frozenset[int], vocab_size: int, device: Any
    ) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.stop_ids = torch.tensor(sorted(stop_token_ids), device=device)
        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None

    def start(self, row: RowState) -> RowState:
        """Ready `row` for decoding: how far back to look for its stop strings, and a fresh
        matcher for its grammar."""
        row.tail = stop_tail(self.tokenizer, row.params.stop)
        if row.params.constraint is not None:
            row.matcher = row.params.constraint.matcher(
                self.tokenizer, self.vocab_size, self.stop_token_ids
            )
        return row

    def mask(self, logits: torch.Tensor, rows: Sequence[RowState]) -> Masking | None:
        """Mask `logits` (`[len(rows), vocab]`, fp32) in place: no stop before min_tokens,
        and only what each row's grammar allows. Returns what `record` needs to log the
        unmasked log-probs (None when no row was masked)."""
        early = [
            j
            for j, r in enumerate(rows)
            if r.matcher is None and len(r.tokens) < r.params.min_tokens
        ]
        constrained = [j for j, r in enumerate(rows) if r.matcher is not None]
        if not early and not constrained:
            return None
        scale = torch.tensor(
            [1.0 / r.params.temperature if r.params.temperature > 0 else 1.0 for r in rows],
            device=logits.device,
        )
        raw_lse = torch.logsumexp(logits * scale[:, None], dim=-1)
        if early:  # too early to stop
            idx = torch.tensor(early, device=logits.device)
            logits[idx[:, None], self.stop_ids[None, :]] = float("-inf")
        if constrained:
            from agentrft.policy.constrain import apply_grammars

            self._bitmask = apply_grammars(
                logits, [(j, rows[j].matcher) for j in constrained], self._bitmask
            )
        forced = torch.isfinite(logits).sum(dim=-1) == 1
        return Masking(logits, scale, raw_lse, forced)

    def record(
        self,
        rows: Sequence[RowState],
        tok: torch.Tensor,
        logp: torch.Tensor,
        masking: Masking | None = None,
    ) -> None:
        """Append each row's chosen token and log-prob (the unmasked one, given `mask`'s
        `masking`); end the rows it ends."""
        forced = [False] * len(rows)
        if masking is not None:
            logp = masking.raw_logprobs(tok)
            forced = masking.forced.tolist()
        for row, t, lp, only in zip(rows, tok.tolist(), logp.tolist(), forced, strict=True):
            row.tokens.append(t)
            row.logprobs.append(lp)
            row.forced.append(only)
            n = len(row.tokens)
            if row.matcher is not None and not row.matcher.accept_token(t):
                raise RuntimeError(f"token {t} was sampled outside the row's grammar")
            if t in self.stop_token_ids:
                row.finish_reason = "stop"
            elif row.params.stop and n >= row.params.min_tokens:
                hit = stop_string_hit(self.tokenizer, row.tokens, row.params.stop, row.tail)
                if hit is not None:
                    row.finish_reason, row.stop_text = "stop", hit
            if row.finish_reason is None and n >= row.limit:
                row.finish_reason = "length"


def stop_tail(tokenizer: Any, stops: Sequence[str]) -> int:
    """How many of the last tokens to decode to see any of `stops` that has just ended."""
    return max((len(tokenizer.encode(s, add_special_tokens=False)) for s in stops), default=0) + 2


def stop_string_hit(
    tokenizer: Any, tokens: Sequence[int], stops: Sequence[str], tail: int
) -> str | None:
    """The stop string in the text of the last `tail` of `tokens`, if any."""
    recent = tokenizer.decode(list(tokens[-tail:]))
    return next((s for s in stops if s in recent), None)
