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

The caches hold their keys and values in buffers with room for the reply (`GrowingLayer`):
transformers' DynamicLayer copies the whole cache at every decode step and layer
(`torch.cat`), which took a sixth of a batch-16 decode at a 300-token context, and more as
contexts grow.

Decode steps attend through `decode_attention`. Rows that share a prompt hold identical
copies of its keys and values; inside `shared_prefix(...)` a decode step reads that prefix
once for all of them (every row's query against the one copy, as one matmul) and each row's
own columns after it, and joins the two softmax parts exactly. At batch 16 over a 416-token
prompt this cut the keys and values read per step about sixteenfold: in fp32 they were 60%
as many bytes as the weights.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from agentrft.policy.kv_cache import CachedPrefix

# (input_ids, attention_mask, position_ids, cache) -> the next-token logits of each row
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views into buffers with `reserve` spare
    columns: a decode step writes its column in place instead of copying the whole cache.
    Same values, same attention results, bit for bit."""

    def __init__(self, reserve: int = 64) -> None:
        super().__init__()
        self.reserve = max(1, reserve)
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._n = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self._n + key_states.shape[-2]
        if self._keys is None or self._values is None or n > self._keys.shape[-2]:
            cap = n + self.reserve
            keys = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
            values = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
            if self._keys is not None and self._values is not None and self._n:
                keys[:, :, : self._n] = self._keys[:, :, : self._n]
                values[:, :, : self._n] = self._values[:, :, : self._n]
            self._keys, self._values = keys, values
        self._keys[:, :, self._n : n] = key_states
        self._values[:, :, self._n : n] = value_states
        self._n = n
        self.keys, self.values = self._keys[:, :, :n], self._values[:, :, :n]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._keys is not None and self._values is not None and self._n:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, : self._n], self._values[:, :, : self._n]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("GrowingLayer does not crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowingLayer does not repeat rows")


def new_cache(reserve: int, layers: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> Any:
    """A DynamicCache of GrowingLayers with room for `reserve` more tokens, holding `layers`
    (keys, values per layer) if given, else filled by the first forward pass."""
    cache = DynamicCache()
    if layers:
        cache.layers = []
        for keys, values in layers:
            layer = GrowingLayer(reserve)
            layer.update(keys, values)
            cache.layers.append(layer)
    else:
        cache.layer_class_to_replicate = functools.partial(GrowingLayer, reserve)  # type: ignore[assignment]  # called with no arguments, as a class is
    return cache


DECODE_ATTENTION = "agentrft_sdpa"


@dataclass(frozen=True)
class SharedPrefix:
    """Decode rows whose keys and values are equal in the first `width` columns, by group
    (row indices, the first row holds the copy that is read); `alone` are the other rows."""

    width: int
    groups: tuple[torch.Tensor, ...]
    alone: torch.Tensor
    # per attention layer and group: its prefix's keys transposed and values, in fp32, made
    # at the first decode step (the prefix does not change while the batch decodes)
    _prepared: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def prefix(
        self, layer: Any, group: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Group `group`'s prefix in `layer` as (keys [heads, dim, width], values [heads,
        width, dim]), contiguous fp32, read from its first row the first time."""
        slot = (id(layer), group)
        if slot not in self._prepared:
            first, w = int(self.groups[group][0]), self.width
            self._prepared[slot] = (
                key[first, :, :w].float().mT.contiguous(),
                value[first, :, :w].float().contiguous(),
            )
        return self._prepared[slot]

    @classmethod
    def of(cls, prompt_of: Sequence[Hashable | None], width: int) -> SharedPrefix | None:
        """From each row's shared prompt (None: its own); None where no two rows share one."""
        rows: dict[Hashable, list[int]] = {}
        for row, prompt in enumerate(prompt_of):
            if prompt is not None:
                rows.setdefault(prompt, []).append(row)
        groups = [g for g in rows.values() if len(g) > 1]
        if not groups or width < 1:
            return None
        grouped = {r for g in groups for r in g}
        return cls(
            width,
            tuple(torch.tensor(g) for g in groups),
            torch.tensor([r for r in range(len(prompt_of)) if r not in grouped], dtype=torch.long),
        )


_SHARED: ContextVar[SharedPrefix | None] = ContextVar("agentrft_shared_prefix", default=None)


def current_shared_prefix() -> SharedPrefix | None:
    """The SharedPrefix of the decode step running now (inside `shared_prefix(...)`)."""
    return _SHARED.get()


@contextlib.contextmanager
def shared_prefix(shared: SharedPrefix | None) -> Iterator[None]:
    """Decode steps run inside read each group's shared prefix once (see the module doc)."""
    token = _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared_prefix_attention(
    shared: SharedPrefix,
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """One decode step's attention, [rows, kv_heads, groups, dim] queries, reading each
    group's prefix once; the same result as attending over every row's own columns. The
    scores of the prefix (per group, every row's query against its one copy, as one matmul)
    and of each row's own columns are joined and normalised together, in fp32."""
    rows, kv_heads, per_kv, dim = query.shape
    w = shared.width
    q = query.float()
    whole = len(shared.groups) == 1 and len(shared.groups[0]) == rows  # one group, rows in order

    def by_head(
        t: torch.Tensor, group: torch.Tensor
    ) -> torch.Tensor:  # [n, h, g, x] -> [h, n*g, x]
        t = t if whole else t[group]
        return t.transpose(0, 1).reshape(kv_heads, -1, t.shape[-1])

    def by_row(t: torch.Tensor, n: int) -> torch.Tensor:  # [h, n*g, x] -> [n, h, g, x]
        return t.view(kv_heads, n, per_kv, t.shape[-1]).transpose(0, 1)

    prefixes = [shared.prefix(layer, g, key, value) for g in range(len(shared.groups))]
    own = torch.matmul(q, key[:, :, w:].float().mT)
    if whole and mask is None:  # a GRPO group's first turn: all in [heads, rows x groups, ...]
        scores = torch.cat(
            [
                torch.matmul(by_head(q, shared.groups[0]), prefixes[0][0]),
                by_head(own, shared.groups[0]),
            ],
            dim=-1,
        )
        if scale != 1.0:
            scores.mul_(scale)
        weights = torch.softmax(scores, dim=-1)
        out = by_row(torch.matmul(weights[..., :w], prefixes[0][1]), rows)
        own_weights = by_row(weights[..., w:], rows)
        return (out + torch.matmul(own_weights, value[:, :, w:].float())).to(query.dtype)
    if whole:
        prefix = by_row(torch.matmul(by_head(q, shared.groups[0]), prefixes[0][0]), rows)
    else:
        prefix = q.new_empty((rows, kv_heads, per_kv, w))
        for group, (keys_t, _) in zip(shared.groups, prefixes, strict=True):
            prefix[group] = by_row(torch.matmul(by_head(q, group), keys_t), len(group))
        if len(shared.alone):
            a = shared.alone
            prefix[a] = torch.matmul(q[a], key[a, :, :w].float().mT)
    scores = torch.cat([prefix, own], dim=-1)
    if scale != 1.0:
        scores.mul_(scale)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights[..., w:], value[:, :, w:].float())
    head = weights[..., :w]
    if whole:
        out += by_row(torch.matmul(by_head(head, shared.groups[0]), prefixes[0][1]), rows)
    else:
        for group, (_, values) in zip(shared.groups, prefixes, strict=True):
            out[group] += by_row(torch.matmul(by_head(head, group), values), len(group))
        if len(shared.alone):
            a = shared.alone
            out[a] += torch.matmul(head[a], value[a, :, :w].float())
    return out.to(query.dtype)


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except at a decode step on a CPU (one query per row, no
    dropout) on grouped-query heads, where the queries are packed onto their key/value
    heads: inside `shared_prefix(...)` to read shared prefixes once, and without a mask
    (rows that share one prompt have no padding) because transformers' choice there, torch's
    `enable_gqa`, ran about 8x slower in bf16 on a CPU (a third of a decode step)."""
    groups = getattr(module, "num_key_value_groups", 1)
    shared = _SHARED.get()
    if (
        query.shape[2] != 1
        or query.device.type != "cpu"  # measured on CPUs only; GPUs keep transformers' kernels
        or groups == 1
        or kwargs.get("dropout")
        or (attention_mask is not None and shared is None)
        or (shared is not None and shared.width >= key.shape[2])
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows, heads, _, dim = query.shape
    packed = query.reshape(rows, heads // groups, groups, dim)
    scale = kwargs.get("scaling") or dim**-0.5
    if shared is not None:
        out = shared_prefix_attention(shared, module, packed, key, value, attention_mask, scale)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, scale=scale)
    return out.reshape(rows, 1, heads, dim), None  # [rows, 1 token, heads, dim], as sdpa returns


def use_decode_attention(model: Any) -> None:
    """Attend through `decode_attention` where `model` uses transformers' sdpa; same results."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(DECODE_ATTENTION)


@dataclass
class Prefilled:
    logits: torch.Tensor  # [rows, vocab] float32: the next token's logits
    cache: Any  # DynamicCache, [rows, kv_heads, width, head_dim] per layer
    mask: torch.Tensor  # [rows, width] 1 where a real token is
    last_pos: torch.Tensor  # [rows, 1] each row's last position
    tokens: int  # prompt tokens that ran through the model (padding not counted)
    # rows with one label (not None) hold equal keys and values in their first `shared_width` columns
    prompt_of: tuple[Hashable | None, ...] = ()
    shared_width: int = 0


def prefill_prompts(
    forward: Forward, prompts: Sequence[Sequence[int]], pad_id: int, dev: torch.device, reserve: int
) -> Prefilled:
    """Prefill each distinct prompt once (left-padded), then give every row its copy. The
    cache has room for `reserve` more tokens (the longest reply)."""
    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    width = max(len(p) for p in distinct)
    ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(reserve)
    expand = torch.tensor(row_of, dtype=torch.long, device=dev)
    logits = forward(ids, mask, positions, cache)
    if len(distinct) < len(prompts):
        cache.reorder_cache(expand)  # type: ignore[arg-type]  # any long tensor does
    return Prefilled(
        logits[expand].float(),
        cache,
        mask[expand],
        positions[expand, -1:],
        sum(len(p) for p in distinct),
        tuple(row_of),
        width,
    )


def prefill_suffixes(
    forward: Forward,
    kept: Sequence[CachedPrefix],
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    dev: torch.device,
    reserve: int,
) -> Prefilled:
    """Extend each row's kept prefix by the rest of its prompt (which must start with it)."""
    R = len(kept)
    past = [len(k.tokens) for k in kept]
    suffixes = [p[n:] for p, n in zip(prompts, past, strict=True)]
    wp, ws = max(past), max(len(s) for s in suffixes)
    ids = torch.full((R, ws), pad_id, dtype=torch.long)
    mask = torch.zeros((R, wp + ws), dtype=torch.long)
    for r, (n, s) in enumerate(zip(past, suffixes, strict=True)):
        ids[r, ws - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[r, wp - n : wp] = 1
        mask[r, wp + ws - len(s) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    layers = []
    for depth in range(len(kept[0].layers)):
        k0, v0 = kept[0].layers[depth]
        keys = k0.new_zeros((R, k0.shape[0], wp, k0.shape[-1]))
        values = v0.new_zeros((R, v0.shape[0], wp, v0.shape[-1]))
        for r, (entry, n) in enumerate(zip(kept, past, strict=True)):
            k, v = entry.layers[depth]
            keys[r, :, wp - n :] = k
            values[r, :, wp - n :] = v
        layers.append((keys, values))
    cache = new_cache(ws + reserve, layers)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = forward(ids, mask, positions[:, wp:], cache)
    return Prefilled(
        logits.float(), cache, mask, positions[:, -1:], sum(len(s) for s in suffixes), (None,) * R
    )


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    extra = width - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def stack(parts: Sequence[Prefilled], reserve: int) -> Prefilled:
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
        new_cache(reserve, layers),
        torch.cat([_left_pad(p.mask, width, 1) for p in parts]),
        torch.cat([p.last_pos for p in parts]),
        sum(p.tokens for p in parts),
        tuple(  # a part's shared columns, once left-padded, start at column 0 again
            None if p.shared_width < p.mask.shape[1] or n is None else (i, n)
            for i, p in enumerate(parts)
            for n in p.prompt_of or (None,) * p.mask.shape[0]
        ),
        width,
    )


def row_prefix(
    cache: Any, mask: torch.Tensor, row: int, tokens: Sequence[int]
) -> CachedPrefix | None:
    """Row `row`'s keys and values without its padding, as an entry to keep for its next
    turn: `tokens` are the tokens they hold. None for caches other than plain dynamic
    layers (sliding windows, linear attention), whose state is not just keys and values."""
    if not all(type(layer) in (DynamicLayer, GrowingLayer) for layer in cache.layers):
        return None
    real = mask[row].bool()
    if int(real.sum()) != len(tokens):
        raise AssertionError(f"the KV cache holds {int(real.sum())} tokens, not {len(tokens)}")
    layers = tuple((layer.keys[row][:, real], layer.values[row][:, real]) for layer in cache.layers)
    return CachedPrefix(tuple(tokens), layers)
