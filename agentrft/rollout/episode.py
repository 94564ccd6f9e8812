"""One rollout: a single-use episode that mints a trace_id, alternates model replies and
tool calls, and always ends with a recorded stop reason.

    prompt -> [prefill] -> sample -> parse -> (final answer | run tools concurrently -> append) -> ...

Failures are data: an unparsable call becomes a tool message saying what was wrong; a tool
that stays unavailable ends the rollout as discarded (kept out of training statistics).
The stop rules and tool execution live in `turns.py`, shared with `chat_episode.py`; this
file keeps what is token-level: prefill tokens, context room and template glue.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentrft.policy import after_prefill
from agentrft.policy.tool_format import parse_reply
from agentrft.rollout.batching import Sampler
from agentrft.rollout.context import ChatRenderer, Context
from agentrft.rollout.turns import (
    EpisodeLog,
    EpisodeSettings,
    assistant_message,
    finish_turn,
    new_trace_id,
)
from agentrft.seeds import TURN_STRIDE
from agentrft.tools import release_tools
from agentrft.types import Item, Origin, StopReason, Trajectory


@dataclass(frozen=True, kw_only=True)
class RolloutSettings(EpisodeSettings):
    """Everything a token-level episode needs besides its sampler. Picklable."""

    renderer: ChatRenderer
    context_window: int = 2048
    prefills: tuple[str, ...] = ()  # fixed start of reply 0, 1, ... (inserted, not sampled)

    def prefill_for(
        self, turn: int, item: Item, messages: Sequence[Mapping[str, Any]] = ()
    ) -> str | None:
        """The text reply `turn` starts with, given the rollout's `messages` so far; a row's
        own `prefill` replaces the first. None once a tool said `prefill_until`."""
        if turn and self.prefill_ended(messages):
            return None
        if turn == 0 and item.prefill is not None:
            return item.prefill
        if self.prefill_all_turns:
            return self.prefills[0] if self.prefills else None
        return self.prefills[turn] if turn < len(self.prefills) else None


async def run_episode(
    item: Item,
    settings: RolloutSettings,
    sampler: Sampler,
    client: httpx.AsyncClient,
    trace_id: str | None = None,
    seed: int | None = None,
) -> Trajectory:
    """Run one rollout to its end. `seed` makes its samples reproducible whatever else is
    batched with them (each reply draws from `seed + TURN_STRIDE * turn`, agentrft.seeds). Its KV cache is kept between
    its turns under its trace id, and released when it ends."""
    renderer = settings.renderer
    messages, ctx = renderer.initial(item)
    log = EpisodeLog(item, messages, trace_id=trace_id or new_trace_id())
    try:
        return await _turns(log, ctx, item, settings, sampler, client, seed)
    finally:
        sampler.release(log.trace_id)
        await release_tools(settings.tools, log.trace_id)


async def _turns(
    log: EpisodeLog,
    ctx: Context,
    item: Item,
    settings: RolloutSettings,
    sampler: Sampler,
    client: httpx.AsyncClient,
    seed: int | None,
) -> Trajectory:
    renderer, tok = settings.renderer, settings.renderer.tokenizer
    sampled_total = 0
    stop: StopReason | None

    while True:
        prefill = settings.prefill_for(len(log.turns), item, log.messages)
        prefill_ids = renderer.prefill_tokens(prefill) if prefill else []
        if prefill_ids:
            ctx.insert(prefill_ids, [Origin.PREFILL] * len(prefill_ids))
        room = settings.context_window - len(ctx)
        budget = settings.max_tokens_per_episode - sampled_total
        if room < 1:
            stop = StopReason.CONTEXT_OVERFLOW
            break
        if budget < 1:
            stop = StopReason.MAX_TOKENS
            break
        max_new = min(settings.max_tokens_per_turn, room, budget)
        t0 = time.perf_counter()
        completion = await sampler.sample(
            list(ctx.tokens),
            max_new,
            None if seed is None else seed + TURN_STRIDE * len(log.turns),
            params=after_prefill(sampler.params, prefill),
            key=log.trace_id,
        )
        sample_s = time.perf_counter() - t0
        ctx.sampled(completion.tokens, completion.logprobs, completion.forced)
        sampled_total += len(completion.tokens)
        text = (prefill or "") + tok.decode(
            list(completion.reply_tokens), skip_special_tokens=False
        )
        stop, answers = await finish_turn(
            log,
            text,
            parse_reply(text, settings.schemas).calls,
            ended=completion.finish_reason == "stop",
            sampled_tokens=len(completion.tokens),
            sample_s=sample_s,
            assistant=functools.partial(assistant_message, text),
            rules=settings.rules,
            tools=settings.tools,
            client=client,
            cut_off=StopReason.CONTEXT_OVERFLOW
            if len(ctx) >= settings.context_window
            else StopReason.MAX_TOKENS,
        )
        if stop is not None:
            break
        # append the template glue and the tool outputs, token-in/token-out
        stop_text = (
            tok.decode([completion.tokens[-1]], skip_special_tokens=False)
            if completion.ended_by_stop_token
            else ""
        )
        glue, origins = renderer.continuation(
            log.messages[: len(log.messages) - len(answers)], answers, stop_text
        )
        ctx.insert(glue, origins)

    return log.trajectory(stop, ctx.tokens, ctx.origins, ctx.logprobs)
