"""Test doubles for the policy side: a byte-level tokenizer with a ChatML template, and a
policy that replies with scripted text. Real enough for the rollout engine and the server
(offsets, stop tokens, stop strings, token limits), and instant."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrft.policy import Completion, SamplingParams

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_tokenizer() -> Any:
    """One token per byte, plus <|im_start|> and <|im_end|> (the stop token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


class ScriptedPolicy:
    """Replies with `respond(prompt_text)` for every row, like a model that always says that.

    Records each `sample` call as (rows, params) in `calls`; `delay_s` makes a call take
    time (it runs in a worker thread, as the real one does) so concurrent requests queue.
    """

    def __init__(self, respond: Callable[[str], str] | Sequence[str], tokenizer: Any = None, context_window: int = 4096, delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer or byte_tokenizer()
        self.stop_token_ids = frozenset({self.tokenizer.eos_token_id})
        self.context_window = context_window
        self.delay_s = delay_s
        if callable(respond):
            self._respond = respond
        else:
            script = list(respond)
            self._respond = lambda _prompt: script.pop(0) if len(script) > 1 else script[0]
        self.calls: list[tuple[int, SamplingParams]] = []
        self._lock = threading.Lock()

    def sample(self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_tokens: Sequence[int] | None = None) -> list[Completion]:
        with self._lock:
            self.calls.append((len(prompts), params))
        if self.delay_s:
            time.sleep(self.delay_s)
        limits = [min(params.max_tokens, m) for m in max_tokens] if max_tokens is not None else [params.max_tokens] * len(prompts)
        out = []
        for prompt, limit in zip(prompts, limits, strict=True):
            with self._lock:
                reply = self._respond(self.tokenizer.decode(list(prompt)))
            stop_text = next((s for s in params.stop if s in reply), "")
            if stop_text:  # like HFPolicy: the reply ends right after the stop string, kept
                reply = reply[: reply.index(stop_text) + len(stop_text)]
            ids = list(self.tokenizer.encode(reply, add_special_tokens=False))
            if not stop_text:
                ids.append(self.tokenizer.eos_token_id)
            finish = "stop"
            if len(ids) > limit:
                ids, finish, stop_text = ids[:limit], "length", ""
            out.append(Completion(tuple(ids), tuple([-0.5] * len(ids)), finish, stop_text))  # type: ignore[arg-type]
        return out
