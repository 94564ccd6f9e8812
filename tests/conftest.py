"""Shared fixtures. Tiers: unit (no model weights), integration (the real 135M model), slow."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from agentrft.policy import Completion, SamplingParams
from tests.needs import IN_CI, INSTALL, missing

SLOW_TIMEOUT_S = 7200  # a learning curve runs a whole demo; the default per test is 600 s


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under CI, a machine without the sandbox or the browser fails the run at once, with the
    install command, rather than skipping the tests that need them."""
    lacking = [tool for tool in INSTALL if missing(tool)]
    if IN_CI and lacking:
        pytest.exit("CI needs " + "; ".join(f"{t}: {INSTALL[t]}" for t in lacking), returncode=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture(scope="session")
def model_dir():
    from agentrft.policy.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class ScriptedPolicy:
    """A policy that replies with scripted text through the real tokenizer, and records every
    prompt it was shown. For tests where the tools or the engine, not the model, are under test.

    `replies` is a list (reply for turn 0, 1, ...; the last one repeats) or a callable
    `(prompt_text, turn) -> str`. The turn is the number of assistant replies already in the
    prompt, not counting `fewshot_turns` example replies.

    Stop strings in the params end a reply right after them, kept, as HFPolicy does. Every
    call is logged in `calls` as (rows, params, seeds); `delay_s` makes each call take that
    long (it runs in a worker thread, as the real one does), so concurrent requests queue.
    """

    def __init__(
        self,
        tokenizer,
        replies,
        end_with_eos: bool = True,
        fewshot_turns: int = 0,
        context_window: int = 8192,
        delay_s: float = 0.0,
    ):
        self.tokenizer = tokenizer
        self.stop_token_ids = frozenset({tokenizer.eos_token_id})
        self.context_window = context_window
        self.replies = replies
        self.end_with_eos = end_with_eos
        self.fewshot_turns = fewshot_turns
        self.delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.calls: list[tuple[int, SamplingParams, tuple[int, ...] | None]] = []

    def _reply(self, prompt: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(prompt))
        turn = text.count("<|im_start|>assistant") - self.fewshot_turns - 1
        if callable(self.replies):
            return self.replies(text, turn)
        return self.replies[min(turn, len(self.replies) - 1)]

    def sample(
        self, prompts, params: SamplingParams, max_tokens=None, seeds=None
    ) -> list[Completion]:
        self.calls.append((len(prompts), params, None if seeds is None else tuple(seeds)))
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for i, p in enumerate(prompts):
            self.prompts.append(list(p))
            reply = self._reply(p)
            stop_text = next((s for s in params.stop if s in reply), "")
            if stop_text:
                reply = reply[: reply.index(stop_text) + len(stop_text)]
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            if self.end_with_eos and not stop_text:
                ids = ids + [self.tokenizer.eos_token_id]
            limit = min(params.max_tokens, max_tokens[i]) if max_tokens else params.max_tokens
            finish = "stop" if (self.end_with_eos or stop_text) and len(ids) <= limit else "length"
            stop_text = stop_text if finish == "stop" else ""
            ids = ids[:limit]
            out.append(Completion(tuple(ids), tuple([-0.5] * len(ids)), finish, stop_text))
        return out


@pytest.fixture
def scripted(tokenizer):
    def make(replies, **kw):
        return ScriptedPolicy(tokenizer, replies, **kw)

    return make
