"""KV caches kept between a rollout's turns, so its next turn prefills only what was appended.

A rollout is token-in/token-out: its next prompt is its previous prompt, the tokens it
sampled, then the template glue and tool outputs, never re-tokenized. So the keys and values
computed for the previous turn are still valid for the start of the next one, and only the
new suffix has to run through the model:

    turn 1: prefill prompt (shared by the group, once)        -> decode -> keep(prompt + reply)
    turn 2: take(kept) + prefill(last reply token + tool output) -> decode -> keep(...)

Each entry belongs to one rollout (its key, the trace id) and is taken out while the rollout
samples, so two rollouts never share one. The store is bounded: entries past `max_bytes` are
evicted oldest first, an entry is not kept while the machine is short of memory, and a
rollout whose entry is gone simply re-prefills (the same tokens, the same log-probs within
floating-point tolerance). A finished rollout releases its entry.

The tensors are torch's; this module does not import torch, so the rollout engine can hold a
store without loading it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_AVAILABLE_BYTES = (
    512 << 20
)  # keep nothing that would leave the machine less free memory than this


@dataclass(frozen=True)
class CachedPrefix:
    """The keys and values of `tokens`, one (keys, values) pair per layer, each shaped
    [kv_heads, len(tokens), head_dim]."""

    tokens: tuple[int, ...]
    layers: tuple[tuple[Any, Any], ...]

    @property
    def nbytes(self) -> int:
        return sum(
            int(k.numel() * k.element_size() + v.numel() * v.element_size()) for k, v in self.layers
        )


@dataclass
class PrefixCacheStats:
    prefill_tokens: int = 0  # prompt tokens run through the model (a shared prompt counts once)
    reused_tokens: int = 0  # prompt tokens whose keys and values came from a kept entry
    kept: int = 0  # entries stored
    evicted: int = 0  # entries dropped to stay under the memory bound
    refused: int = 0  # entries not stored: over the bound on their own, or memory was short
    peak_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class PrefixCache:
    """Kept KV caches by rollout key, bounded by `max_bytes` (0 keeps nothing, which turns
    re-use off while still counting prefill tokens). Thread-safe: the policy fills it from
    the sampling thread while finished rollouts release entries from the event loop."""

    max_bytes: int
    min_available: int = MIN_AVAILABLE_BYTES
    memory_available: Callable[[], int | None] = available_memory
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    _entries: OrderedDict[Hashable, CachedPrefix] = field(default_factory=OrderedDict)
    _sizes: dict[Hashable, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: Hashable, prompt: Sequence[int]) -> CachedPrefix | None:
        """Remove and return `key`'s entry when it holds a strict prefix of `prompt`."""
        with self._lock:
            entry = self._entries.pop(key, None)
            self._sizes.pop(key, None)
        if (
            entry is None
            or len(entry.tokens) >= len(prompt)
            or tuple(prompt[: len(entry.tokens)]) != entry.tokens
        ):
            return None
        return entry

    def put(self, key: Hashable, entry: CachedPrefix) -> bool:
        """Keep `entry` for `key`, evicting the oldest entries to make room. False when it
        was not kept (re-use off, larger than the bound, or memory is short)."""
        size = entry.nbytes
        if self.max_bytes <= 0:
            return False
        free = self.memory_available()
        if size > self.max_bytes or (free is not None and free - size < self.min_available):
            self.stats.refused += 1
            self.release(key)  # a stale entry must not outlive a newer turn
            return False
        with self._lock:
            self._entries.pop(key, None)
            self._sizes.pop(key, None)
            while self._entries and self.nbytes + size > self.max_bytes:
                old, _ = self._entries.popitem(last=False)
                self._sizes.pop(old, None)
                self.stats.evicted += 1
            self._entries[key] = entry
            self._sizes[key] = size
            self.stats.kept += 1
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.nbytes)
        return True

    def release(self, key: Hashable) -> None:
        """Forget `key`'s entry (its rollout has ended)."""
        with self._lock:
            self._entries.pop(key, None)
            self._sizes.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._sizes.clear()
