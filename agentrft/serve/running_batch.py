"""The rows the serving scheduler is decoding, as one batch that rows join and leave.

A row joins after its own prefill forward pass (`policy.prefill.prefill_prompts`: new
prompts left-padded together, identical ones, the `n` choices of one request, once); its
keys and values are then left-padded to the running batch's width and concatenated to it,
layer by layer. Every decode step feeds each row the token it last sampled and samples the
next one with that row's own sampling params and random stream (`HFPolicy`'s `choose_rows`),
under the same row rules as `HFPolicy.sample` (`policy.row_state`: min_tokens, stop tokens and
strings, a grammar).
A finished row is dropped from the cache at once, and columns that no remaining row uses
any more (the padding of a long prompt that has left) are cut off.

Invariant between calls: `kv` and `mask` hold each row's prompt and every sampled token but
the last, `pending` holds the last (not yet run through the model), `last_pos` the position
of the last token in `kv`. Padding is masked out and positions are explicit, so a row's
logits do not depend on its batch-mates beyond floating-point rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrft.policy.hf import HFPolicy, choose_rows
from agentrft.policy.prefill import _left_pad, new_cache, prefill_prompts
from agentrft.policy.row_state import RowState

RESERVE = 64  # spare KV columns allocated at a time; a step writes its column in place
TRIM_MIN = 64  # unused leading columns worth a copy of the cache to drop


@dataclass(eq=False)
class Row(RowState):
    """One choice of one request being decoded (`limit` is its params' max_tokens)."""

    prompt: Sequence[int] = ()
    generator: torch.Generator = field(default_factory=torch.Generator)
    sent: int = 0  # tokens already handed to the request (the scheduler's count)


class RunningBatch:
    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy
        self.rules = policy.row_rules()
        self._reset()

    def _reset(self) -> None:
        self.rows: list[Row] = []
        self.kv: Any = None  # DynamicCache, [rows, kv_heads, width, head_dim] per layer
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.last_pos = torch.zeros((0, 1), dtype=torch.long)
        self.pending = torch.zeros((0,), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    @torch.no_grad()
    def admit(self, rows: Sequence[Row]) -> None:
        """Prefill `rows` in one forward pass, sample their first token, join them."""
        if not rows:
            return
        policy = self.policy
        for row in rows:
            self.rules.start(row)
        part = prefill_prompts(
            policy.forward_last,
            [r.prompt for r in rows],
            policy.pad_token_id,
            policy.device,
            RESERVE,
        )
        tok = self._sample(part.logits, rows)
        if not self.rows:
            self.kv, self.mask, self.last_pos, self.pending = (
                part.cache,
                part.mask,
                part.last_pos,
                tok,
            )
        else:
            width = max(self.width, int(part.mask.shape[1]))
            layers = [
                (
                    torch.cat([_left_pad(old.keys, width, 2), _left_pad(new.keys, width, 2)]),
                    torch.cat([_left_pad(old.values, width, 2), _left_pad(new.values, width, 2)]),
                )
                for old, new in zip(self.kv.layers, part.cache.layers, strict=True)
            ]
            self.kv = new_cache(RESERVE, layers)
            self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(part.mask, width, 1)])
            self.last_pos = torch.cat([self.last_pos, part.last_pos])
            self.pending = torch.cat([self.pending, tok])
        self.rows.extend(rows)

    @torch.no_grad()
    def step(self) -> None:
        """Run every row's pending token and sample its next one."""
        dev = self.policy.device
        self.mask = torch.cat(
            [self.mask, torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=dev)], dim=1
        )
        self.last_pos = self.last_pos + 1
        logits = self.policy.forward_last(self.pending[:, None], self.mask, self.last_pos, self.kv)
        self.pending = self._sample(logits.float(), self.rows)

    def _sample(self, logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
        """Choose each row's next token, record it, and mark rows that it finishes."""
        masking = self.rules.mask(logits, rows)
        tok, logp = choose_rows(logits, [r.params for r in rows], [r.generator for r in rows])
        self.rules.record(rows, tok, logp, masking)
        return tok

    def retire(self, gone: Sequence[Row]) -> None:
        """Drop `gone` (finished or cancelled rows) from the batch, and leading columns that
        only they used."""
        if not gone:
            return
        ids = {id(r) for r in gone}
        keep = [j for j, r in enumerate(self.rows) if id(r) not in ids]
        if not keep:
            self._reset()
            return
        if len(keep) < len(self.rows):
            idx = torch.tensor(keep, device=self.policy.device)
            self.kv.batch_select_indices(idx)
            self.mask, self.last_pos, self.pending = (
                self.mask[idx],
                self.last_pos[idx],
                self.pending[idx],
            )
            self.rows = [self.rows[j] for j in keep]
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first >= TRIM_MIN:
            layers = [(la.keys[:, :, first:], la.values[:, :, first:]) for la in self.kv.layers]
            self.kv = new_cache(RESERVE, layers)
            self.mask = self.mask[:, first:]
