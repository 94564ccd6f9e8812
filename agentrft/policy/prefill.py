"""The prefill stage of `HFPolicy.sample`: from prompts to one decode batch.

Two kinds of row arrive together:
- fresh prompts, left-padded into one forward pass, identical prompts (a group's first
  turn) once, their KV cache then copied to every row that shares them;
- rollouts with a kept prefix (`kv_cache.CachedPrefix`, their previous turn), which run only
  their new suffix on top of it. A row's layout is [pad][kept prefix][pad][suffix]: the
  padding is masked out and positions continue from the prefix, so the result equals a
  full prefill within floating-point tolerance.
The two parts are then left-padded to one width and stacked, and decoding goes on as one
batch. Rows are laid out as [fresh rows..., kept rows...]; the caller maps them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrft.policy.kv_cache import CachedPrefix

# (input_ids, attention_mask, position_ids, cache) -> the next-token logits of each row
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]


@dataclass
class Prefilled:
    logits: torch.Tensor  # [rows, vocab] float32: the next token's logits
    cache: Any  # DynamicCache, [rows, kv_heads, width, head_dim] per layer
    mask: torch.Tensor  # [rows, width] 1 where a real token is
    last_pos: torch.Tensor  # [rows, 1] each row's last position
    tokens: int  # prompt tokens that ran through the model (padding not counted)


def prefill_prompts(forward: Forward, prompts: Sequence[Sequence[int]], pad_id: int, dev: torch.device) -> Prefilled:
    """Prefill each distinct prompt once (left-padded), then give every row its copy."""
    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    width = max(len(p) for p in distinct)
    ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    expand = torch.tensor(row_of, dtype=torch.long, device=dev)
    logits = forward(ids, mask, positions, cache)
    if len(distinct) < len(prompts):
        cache.reorder_cache(expand)  # type: ignore[arg-type]  # any long tensor does
    return Prefilled(logits[expand].float(), cache, mask[expand], positions[expand, -1:], sum(len(p) for p in distinct))


def prefill_suffixes(forward: Forward, kept: Sequence[CachedPrefix], prompts: Sequence[Sequence[int]], pad_id: int, dev: torch.device) -> Prefilled:
    """Extend each row's kept prefix by the rest of its prompt (which must start with it)."""
    R = len(kept)
    past = [len(k.tokens) for k in kept]
    suffixes = [p[n:] for p, n in zip(prompts, past, strict=True)]
    wp, ws = max(past), max(len(s) for s in suffixes)
    ids = torch.full((R, ws), pad_id, dtype=torch.long)
    mask = torch.zeros((R, wp + ws), dtype=torch.long)
    for r, (n, s) in enumerate(zip(past, suffixes, strict=True)):
        ids[r, ws - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[r, wp - n:wp] = 1
        mask[r, wp + ws - len(s):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    layers = []
    for depth in range(len(kept[0].layers)):
        k0, v0 = kept[0].layers[depth]
        keys = k0.new_zeros((R, k0.shape[0], wp, k0.shape[-1]))
        values = v0.new_zeros((R, v0.shape[0], wp, v0.shape[-1]))
        for r, (entry, n) in enumerate(zip(kept, past, strict=True)):
            k, v = entry.layers[depth]
            keys[r, :, wp - n:] = k
            values[r, :, wp - n:] = v
        layers.append((keys, values))
    cache = DynamicCache(ddp_cache_data=layers)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = forward(ids, mask, positions[:, wp:], cache)
    return Prefilled(logits.float(), cache, mask, positions[:, -1:], sum(len(s) for s in suffixes))


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    extra = width - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def stack(parts: Sequence[Prefilled]) -> Prefilled:
    """One decode batch from several prefilled parts, in order, left-padded to one width."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.mask.shape[1] for p in parts)
    layers = []
    for depth in range(len(parts[0].cache.layers)):
        keys = torch.cat([_left_pad(p.cache.layers[depth].keys, width, 2) for p in parts])
        values = torch.cat([_left_pad(p.cache.layers[depth].values, width, 2) for p in parts])
        layers.append((keys, values))
    return Prefilled(
        torch.cat([p.logits for p in parts]),
        DynamicCache(ddp_cache_data=layers),
        torch.cat([_left_pad(p.mask, width, 1) for p in parts]),
        torch.cat([p.last_pos for p in parts]),
        sum(p.tokens for p in parts),
    )


def row_prefix(cache: Any, mask: torch.Tensor, row: int, tokens: Sequence[int]) -> CachedPrefix | None:
    """Row `row`'s keys and values without its padding, as an entry to keep for its next
    turn: `tokens` are the tokens they hold. None for caches other than plain dynamic
    layers (sliding windows, linear attention), whose state is not just keys and values."""
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    real = mask[row].bool()
    if int(real.sum()) != len(tokens):
        raise AssertionError(f"the KV cache holds {int(real.sum())} tokens, not {len(tokens)}")
    layers = tuple((layer.keys[row][:, real], layer.values[row][:, real]) for layer in cache.layers)
    return CachedPrefix(tuple(tokens), layers)
