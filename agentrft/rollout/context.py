"""Token-in, token-out: the context of one conversation, built by appending, never re-tokenized.

The prompt is rendered once with the chat template. After each assistant reply, only the
*new* text (the template's glue and the tool messages) is rendered and tokenized, and its
tokens are appended. The model's sampled tokens stay exactly as sampled, so the log-probs
recorded at sampling time line up with the tokens the trainer scores.

How the new text is found: render the conversation with and without the new messages; the
difference is what comes next. Both renders show every assistant reply as a placeholder, so
a template that rewrites earlier replies (Qwen3's drops their `<think>` blocks once the
conversation moves on) still yields only the glue, and the reply's tokens stay as sampled:
turn 3's context is turn 2's plus the new tokens, never a re-render. The template's closing
of the assistant turn (e.g. `<|im_end|>\n`) is found the same way; the part the model
already sampled (its stop token) is not inserted twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrft.errors import ConfigError
from agentrft.policy.tool_format import (
    CLOSE,
    OPEN,
    template_supports_tools,
    tool_schema,
    tools_system_prompt,
)
from agentrft.types import Item, Origin

_SENTINEL = "@@agentrft-reply-end@@"


def _arguments(raw: Any) -> dict[str, Any]:
    """OpenAI sends arguments as a JSON string; templates and our format want an object."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}
    return dict(raw or {})


@dataclass
class Context:
    """The growing, aligned record of one rollout's context."""

    tokens: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def insert(self, tokens: Sequence[int], origins: Sequence[int]) -> None:
        self.tokens.extend(tokens)
        self.origins.extend(origins)
        self.logprobs.extend([0.0] * len(tokens))

    def sampled(
        self, tokens: Sequence[int], logprobs: Sequence[float], forced: Sequence[bool] = ()
    ) -> None:
        """Append a reply's tokens; those in `forced` (the grammar's only choice) as FORCED."""
        self.tokens.extend(tokens)
        if forced:
            self.origins.extend(Origin.FORCED if f else Origin.SAMPLED for f in forced)
        else:
            self.origins.extend([Origin.SAMPLED] * len(tokens))
        self.logprobs.extend(logprobs)

    def __len__(self) -> int:
        return len(self.tokens)


def prompt_messages(
    item: Item,
    system_prompt: str | None,
    few_shot: Sequence[Mapping[str, Any]],
    tool_block: str | None = None,
) -> list[dict[str, Any]]:
    """The conversation a rollout starts from: one system message (the job's text, the
    row's own system message, the tool block), then the few-shot turns, then the row."""
    rows = [dict(m) for m in item.messages]
    parts = [system_prompt] if system_prompt else []
    if rows and rows[0]["role"] in ("system", "developer"):
        parts.append(rows.pop(0)["content"])
    if tool_block:
        parts.append(tool_block)
    system = [{"role": "system", "content": "\n\n".join(p for p in parts if p)}] if parts else []
    return system + [dict(m) for m in few_shot] + rows


class ChatRenderer:
    """Renders prompts and inter-turn glue for one tokenizer and tool set. Picklable."""

    def __init__(
        self,
        tokenizer: Any,
        tool_specs: Sequence[Any] = (),
        system_prompt: str | None = None,
        few_shot_messages: Sequence[Mapping[str, Any]] = (),
        native_tools: bool | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_specs = list(tool_specs)
        self.system_prompt = system_prompt
        self.few_shot = [dict(m) for m in few_shot_messages]
        self.native_tools = (
            template_supports_tools(tokenizer) if native_tools is None else native_tools
        )
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the model's tokenizer has no chat template; agentrft needs one to render conversations"
            )

    # -- rendering -----------------------------------------------------------------------
    def _render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {}
        if self.native_tools and self.tool_specs:
            kwargs["tools"] = [tool_schema(s) for s in self.tool_specs]
        shaped = [self._template_message(m) for m in messages]
        return str(
            self.tokenizer.apply_chat_template(
                shaped, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
            )
        )

    def _template_message(self, m: Mapping[str, Any]) -> dict[str, Any]:
        """A message as the chat template gets it. OpenAI-style `tool_calls` written by the
        user (few-shot examples, a row's earlier turns) go through the template's own tool
        rendering when it has one, else become `<tool_call>` blocks. A reply the model wrote
        already holds its calls as text and is rendered as written."""
        content = m.get("content") or ""
        calls = m.get("tool_calls") or []
        out: dict[str, Any] = {"role": m["role"], "content": content}
        if calls and OPEN not in content:
            if self.native_tools:
                out["tool_calls"] = [
                    {
                        "type": "function",
                        "id": c.get("id"),
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": _arguments(c["function"].get("arguments")),
                        },
                    }
                    for c in calls
                ]
            else:
                blocks = "".join(
                    OPEN
                    + json.dumps(
                        {
                            "name": c["function"]["name"],
                            "arguments": _arguments(c["function"].get("arguments")),
                        }
                    )
                    + CLOSE
                    for c in calls
                )
                out["content"] = content + blocks
        if m["role"] == "tool" and self.native_tools:
            out.update({k: m[k] for k in ("tool_call_id", "name") if k in m})
        return out

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def prompt_messages(self, item: Item) -> list[dict[str, Any]]:
        """System prompt (job text + the row's own + tool block), few-shot turns, the row."""
        tool_block = (
            tools_system_prompt(self.tool_specs)
            if self.tool_specs and not self.native_tools
            else None
        )
        return prompt_messages(item, self.system_prompt, self.few_shot, tool_block)

    def initial(self, item: Item) -> tuple[list[dict[str, Any]], Context]:
        messages = self.prompt_messages(item)
        ids, _ = self._encode(self._render(messages, add_generation_prompt=True))
        ctx = Context()
        ctx.insert(ids, [Origin.PROMPT] * len(ids))
        return messages, ctx

    def prefill_tokens(self, prefill: str) -> list[int]:
        return self._encode(prefill)[0]

    def continuation(
        self,
        messages: Sequence[Mapping[str, Any]],
        new_messages: Sequence[Mapping[str, Any]],
        sampled_stop_text: str,
    ) -> tuple[list[int], list[int]]:
        """Tokens to append after the last assistant reply in `messages` (which must be the
        last message), given the tool messages that follow it and the text of the stop token
        the model already sampled ("" if none). Returns (tokens, origins)."""
        shown = [
            {"role": "assistant", "content": f"{_SENTINEL}{i}"} if m["role"] == "assistant" else m
            for i, m in enumerate(messages)
        ]
        before = self._render(shown, add_generation_prompt=False)
        after = self._render([*shown, *new_messages], add_generation_prompt=True)
        if not after.startswith(before):
            raise ConfigError(
                "the chat template is not prefix-stable (adding tool messages rewrites earlier ones); token-in/token-out rollouts need a template that only appends after the last reply"
            )
        last = f"{_SENTINEL}{len(messages) - 1}"
        closing = before[before.rfind(last) + len(last) :]
        if sampled_stop_text and closing.startswith(sampled_stop_text):
            closing = closing[len(sampled_stop_text) :]
        delta = after[len(before) :]
        text = closing + delta
        # character spans that hold tool output, to label those tokens TOOL_OUTPUT
        spans, cursor = [], len(closing)
        for m in new_messages:
            content = m.get("content") or ""
            if not content:
                continue
            at = text.find(content, cursor)
            if at >= 0:
                spans.append((at, at + len(content)))
                cursor = at + len(content)
        ids, offsets = self._encode(text)
        origins = [
            Origin.TOOL_OUTPUT if any(a <= s < b for a, b in spans) else Origin.TEMPLATE
            for s, _ in offsets
        ]
        return ids, [int(o) for o in origins]
