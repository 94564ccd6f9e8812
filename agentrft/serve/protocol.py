"""OpenAI chat-completions shapes for `agentrft serve-model`.

Reads a request into what sampling needs (template messages, tool specs, params, prefill)
and writes replies, usage and errors the way the official `openai` client expects them:
whole replies, or with `stream=true` `chat.completion.chunk` events (`ChunkWriter`). Every malformed field is a RequestError (400) naming the field.
Tool calls travel in agentrft's format (`agentrft.policy.tool_format`): an assistant
message's `tool_calls` are written back into its text as `<tool_call>` blocks, and a
reply's blocks come back out as `tool_calls` only when every one of them parses and
matches its schema; otherwise the raw text is the content, so the client sees exactly what
the model wrote (and `agentrft.rollout.chat_episode` reports the error to the model).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from agentrft.data.jsonl import content_text
from agentrft.policy import Completion
from agentrft.policy.constrain import ToolCallGrammar, call_opening, tool_call_grammar
from agentrft.policy.tool_format import (
    OPEN,
    FunctionSpec,
    inline_tool_calls,
    parse_reply,
    specs_from_openai,
)

ROLES = {"system", "developer", "user", "assistant", "tool"}
INT64 = 2**63


class RequestError(Exception):
    """A request the server cannot serve; becomes OpenAI's error JSON with `status`."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
        self.headers = dict(headers or {})  # e.g. Retry-After on a 429

    def body(self) -> dict[str, Any]:
        kind = {404: "not_found_error", 429: "rate_limit_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields agentrft acts on. Others OpenAI clients send (`user`, `metadata`, `store`,
    `parallel_tool_calls`, ...) are accepted and ignored; ones that would change the reply
    in a way agentrft does not implement are refused by `check_supported`."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=128)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    min_tokens: int = Field(
        default=0, ge=0
    )  # vLLM's extra parameter: no stop before this many tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator(
        "n",
        "temperature",
        "top_p",
        "min_tokens",
        "stream",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        mode="before",
    )
    @classmethod
    def _null_means_default(cls, value: Any, info: ValidationInfo) -> Any:
        """Some clients send `null` for "not set"; OpenAI reads it as the default."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


def parse_request(body: Any) -> ChatRequest:
    """Validate the JSON body; the first problem becomes a RequestError naming its field."""
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise RequestError(f"{param}: {err['msg']}" if param else err["msg"], param=param) from None
    check_supported(req)
    return req


def check_supported(req: ChatRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options is only allowed with stream=true", "stream_options")
    if req.logprobs:
        raise RequestError("logprobs is not supported by agentrft serve-model", "logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise RequestError(
                f"{name} is not supported by agentrft serve-model; leave it at 0", name
            )
    if req.logit_bias:
        raise RequestError("logit_bias is not supported by agentrft serve-model", "logit_bias")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise RequestError(
            'only response_format {"type": "text"} is supported by agentrft serve-model',
            "response_format",
        )
    if len(req.stop_strings) > 4:
        raise RequestError("stop: at most 4 stop sequences", "stop")


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """OpenAI messages as the chat template takes them (role + text). `developer` is the
    system role; an assistant's `tool_calls` are written into its text as `<tool_call>`
    blocks; a tool message needs its `tool_call_id`."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}",
                f"messages[{i}].role",
            )
        calls = m.get("tool_calls") or []
        if (
            role == "assistant"
            and calls
            and not (isinstance(calls, list) and all(map(_well_formed_call, calls)))
        ):
            raise RequestError(
                f'messages[{i}].tool_calls: each needs {{"id", "type": "function", "function": {{"name": <string>, "arguments": <JSON string>}}}}',
                f"messages[{i}].tool_calls",
            )
        content = m.get("content")
        parts_ok = not isinstance(content, list) or all(
            isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content
        )
        text = (
            ""
            if content is None and (role == "assistant" and calls)
            else content_text(content)
            if parts_ok
            else None
        )
        if text is None:
            raise RequestError(
                f"messages[{i}].content must be a string or a list of text parts",
                f"messages[{i}].content",
            )
        if role == "tool" and not (isinstance(m.get("tool_call_id"), str) and m["tool_call_id"]):
            raise RequestError(
                f"messages[{i}]: a tool message needs the tool_call_id (a string) of the call it answers",
                f"messages[{i}].tool_call_id",
            )
        if role == "assistant" and calls:
            text = inline_tool_calls(text, calls)
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out


def _well_formed_call(call: Any) -> bool:
    fn = call.get("function") if isinstance(call, Mapping) else None
    return (
        isinstance(fn, Mapping)
        and isinstance(fn.get("name"), str)
        and bool(fn["name"])
        and isinstance(fn.get("arguments", "{}"), str)
    )


@dataclass(frozen=True)
class ToolUse:
    """How a request's tools shape the prompt and the reply."""

    specs: tuple[FunctionSpec, ...]  # rendered into the prompt
    parse: bool  # read <tool_call> blocks back out of the reply
    prefill: str  # forced start of the reply ("required" and named tool choices)
    grammar: ToolCallGrammar | None = None  # what the sampled rest of the reply must match

    @property
    def schemas(self) -> dict[str, Any]:
        return {s.name: s.parameters for s in self.specs}


def tool_use(req: ChatRequest) -> ToolUse:
    """`tool_choice`: "auto" (default), "none" (tools not shown), "required" (the reply is
    prefilled with `<tool_call>`), or {"type": "function", "function": {"name": X}} (prefilled
    up to X's arguments). "required" and a named tool are held to one schema-valid call by a
    grammar; under "auto", a grammar holds calls to `strict: true` tools to their schema
    (and calls to the others to a JSON object) once the reply opens a call."""
    try:
        specs = tuple(specs_from_openai(req.tools or []))
    except ValueError as exc:
        raise RequestError(str(exc), "tools") from None
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    if not specs:
        if choice not in ("auto", "none"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return ToolUse((), False, "")
    if choice == "none":
        return ToolUse((), False, "")
    schemas = [(s.name, s.parameters) for s in specs]
    if choice == "auto":
        strict = strict_tools(req.tools or [])
        if not strict:
            return ToolUse(specs, True, "")
        loose = [(n, sch if n in strict else {"type": "object"}) for n, sch in schemas]
        return ToolUse(specs, True, "", tool_call_grammar(loose, "auto"))
    if choice == "required":
        return ToolUse(specs, True, OPEN, tool_call_grammar(schemas, "required", inside_call=True))
    fn = (
        choice.get("function")
        if isinstance(choice, dict) and choice.get("type", "function") == "function"
        else None
    )
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or name not in {s.name for s in specs}:
        raise RequestError(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": <one of tools>}}',
            "tool_choice",
        )
    return ToolUse(
        specs,
        True,
        OPEN + call_opening(name),
        tool_call_grammar(schemas, "named", name=name, inside_call=True),
    )


def strict_tools(tools: Sequence[Any]) -> set[str]:
    """The names of the function tools marked `strict: true`."""
    return {
        t["function"]["name"]
        for t in tools
        if isinstance(t, Mapping)
        and isinstance(t.get("function"), Mapping)
        and t["function"].get("strict") is True
    }


def choice(index: int, text: str, completion: Completion, tools: ToolUse) -> dict[str, Any]:
    """One OpenAI choice from a reply's text (prefill included, stop string removed)."""
    finish = "length" if completion.finish_reason == "length" else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tools.parse and finish == "stop":
        parsed = parse_reply(text, tools.schemas)
        if parsed.calls and all(c.error is None for c in parsed.calls):
            message["content"] = _content_before_calls(text, parsed.text)
            message["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in parsed.calls
            ]
            finish = "tool_calls"
    return {"index": index, "message": message, "finish_reason": finish, "logprobs": None}


def _content_before_calls(text: str, plain: str) -> str | None:
    """The content that goes with a reply's tool calls. When all of the text comes before
    the first call, it is kept as written (trailing space included), so that writing the
    calls back after it (`inline_tool_calls`) gives the model its own reply again, byte for
    byte; text between or after calls is joined, which that round trip cannot restore."""
    head = text[: text.find(OPEN)]
    if head.strip() == plain:
        return head if plain else None
    return plain


def completion_body(
    model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_body(prompt_tokens, completion_tokens),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """OpenAI's `chat.completion.chunk` events of one streamed completion: per choice the
    role first, then content pieces, then each tool call (id and name, then its arguments)
    and the finish reason; with `include_usage`, a last chunk with the usage and no choices.
    Serialise each as `data: <json>` and end with `data: [DONE]`."""

    def __init__(self, model: str, include_usage: bool = False) -> None:
        self.head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }
        self.include_usage = include_usage

    def chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **self.head,
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ],
            **({"usage": None} if self.include_usage else {}),
        }

    def role(self, index: int) -> dict[str, Any]:
        return self.chunk(index, {"role": "assistant", "content": "", "refusal": None})

    def content(self, index: int, text: str) -> dict[str, Any]:
        return self.chunk(index, {"content": text})

    def end(self, index: int, choice: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chunks that close a finished choice (OpenAI's choice shape): its tool calls,
        then its finish reason."""
        chunks = []
        for k, call in enumerate(choice["message"].get("tool_calls") or []):
            fn = call["function"]
            start = {"name": fn["name"], "arguments": ""}
            chunks.append(
                self.chunk(
                    index,
                    {
                        "tool_calls": [
                            {"index": k, "id": call["id"], "type": "function", "function": start}
                        ]
                    },
                )
            )
            chunks.append(
                self.chunk(
                    index,
                    {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]},
                )
            )
        chunks.append(self.chunk(index, {}, choice["finish_reason"]))
        return chunks

    def usage(self, usage: Mapping[str, int]) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": dict(usage)}


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_card(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "agentrft"}
