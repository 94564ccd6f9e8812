"""How tools are shown to the model and how its calls are read back.

Models whose chat template takes `tools=` get the schemas through it. Others (SmolLM2's
template ignores tools) get agentrft's format: the schemas in the system prompt and calls
written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more per
reply (the Hermes/Qwen convention, so both paths parse the same way).

The parser never raises and never drops anything: each attempted call becomes either a
valid `ToolCall` or one carrying an `error` that is shown to the model as the tool output.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from agentrft.types import FunctionSpec, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_SYNTAX = '<tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>'


def tool_schema(spec: Any) -> dict[str, Any]:
    """OpenAI function-tool shape, as chat templates and OpenAI-compatible servers expect."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def specs_from_openai(tools: Sequence[Any]) -> list[FunctionSpec]:
    """Read OpenAI's `tools` list ([{"type": "function", "function": {"name", "description",
    "parameters"}}]). Raises ValueError naming the bad entry and the fix."""
    specs: list[FunctionSpec] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, Mapping)
        ):
            raise ValueError(
                f'tools[{i}] must look like {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}'
            )
        name, params = fn.get("name"), fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if not isinstance(params, Mapping):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        try:
            jsonschema.Draft202012Validator.check_schema(dict(params))
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"tools[{i}].function.parameters is not a valid JSON schema: {exc.message}"
            ) from None
        specs.append(FunctionSpec(name, str(fn.get("description") or ""), dict(params)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique, got {names}")
    return specs


def render_call(name: str, arguments: Any) -> str:
    """One call in agentrft's written format; `arguments` is a dict or its JSON string."""
    if isinstance(arguments, str):
        with contextlib.suppress(
            json.JSONDecodeError
        ):  # else keep the string: it is what was written
            arguments = json.loads(arguments) if arguments.strip() else {}
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


def inline_tool_calls(content: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant message's text as the model wrote it: OpenAI `tool_calls` written back
    as `<tool_call>` blocks after the content, so the history the model reads again looks
    like what it produced."""
    blocks = "".join(
        render_call(c["function"]["name"], c["function"].get("arguments", "{}")) for c in tool_calls
    )
    return (content or "") + blocks


def template_supports_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def tools_system_prompt(specs: Sequence[Any]) -> str:
    """agentrft's tool block, appended to the system prompt for templates without tools."""
    lines = [
        "# Tools",
        "You can call tools. To call one, write exactly:",
        CALL_SYNTAX,
        "You may write several calls in one reply. Each result comes back in a tool message. "
        "When you have the final answer, reply without any tool call.",
        "",
        "Available tools:",
    ]
    for spec in specs:
        lines.append(
            json.dumps(
                {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
            )
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class ParsedReply:
    calls: tuple[ToolCall, ...]  # every attempted call, valid or not, in order
    text: str  # the reply with tool-call blocks removed (reasoning or final answer)

    @property
    def is_final(self) -> bool:
        return not self.calls


def _new_ids() -> tuple[str, str]:
    h = uuid.uuid4().hex
    return f"fc_{h[:24]}", f"call_{h[8:32]}"


def _invalid(name: str, raw: str, why: str) -> ToolCall:
    fc, call = _new_ids()
    return ToolCall(id=fc, call_id=call, name=name, arguments=raw, error=why)


_DECODER = json.JSONDecoder()


def parse_call(raw: str, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall:
    """Read one `<tool_call>` body. `schemas` maps tool name -> JSON schema of its arguments."""
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return _invalid(
            "",
            body,
            f"the tool call is not valid JSON ({exc.msg} at column {exc.colno}). Write it as {CALL_SYNTAX}",
        )
    except RecursionError:
        return _invalid(
            "", body[:200], f"the tool call is nested too deeply to read. Write it as {CALL_SYNTAX}"
        )
    return _call_from_object(obj, body, schemas)


def _call_from_object(obj: Any, body: str, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall:
    if not isinstance(obj, dict):
        return _invalid("", body, f"the tool call must be a JSON object. Write it as {CALL_SYNTAX}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return _invalid("", body, f'the tool call has no "name". Write it as {CALL_SYNTAX}')
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "(none)"
        return _invalid(name, body, f"unknown tool {name!r}. Available tools: {known}")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return _invalid(name, body, f"the arguments of {name!r} are not valid JSON ({exc.msg})")
    if not isinstance(args, dict):
        return _invalid(name, body, f'"arguments" of {name!r} must be a JSON object')
    extra = set(obj) - {"name", "arguments"}
    if extra:
        return _invalid(
            name,
            body,
            f"unexpected key(s) {sorted(extra)} in the tool call. Write it as {CALL_SYNTAX}",
        )
    try:
        jsonschema.validate(args, dict(schemas[name]))
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
        return _invalid(name, body, f"invalid arguments for {name!r} at {where}: {exc.message}")
    fc, call = _new_ids()
    return ToolCall(id=fc, call_id=call, name=name, arguments=json.dumps(args, ensure_ascii=False))


_CLOSE_AFTER = re.compile(r"\s*" + re.escape(CLOSE))


def _read_block(
    text: str, start: int, schemas: Mapping[str, Mapping[str, Any]]
) -> tuple[ToolCall, int]:
    """Read the call whose body starts at `start` (just after `<tool_call>`); return it and
    the index after the block. The JSON is decoded first, so a `</tool_call>` inside a string
    argument does not cut the call short; only if it does not decode is the body taken up to
    the next closing (or opening) tag."""
    k = start
    while k < len(text) and text[k].isspace():
        k += 1
    try:
        obj, end = _DECODER.raw_decode(text, k)
        if not isinstance(obj, dict):  # only an object is a call; read the rest by its tags
            raise json.JSONDecodeError("not an object", text, k)
    except (json.JSONDecodeError, RecursionError):
        close, reopen = text.find(CLOSE, start), text.find(OPEN, start)
        if reopen >= 0 and (close < 0 or reopen < close):  # a new call starts first
            return parse_call(text[start:reopen], schemas), reopen
        if close < 0:
            return parse_call(text[start:], schemas), len(text)
        return parse_call(text[start:close], schemas), close + len(CLOSE)
    body = text[k:end]
    m = _CLOSE_AFTER.match(text, end)
    if m is None:  # JSON then something other than the closing tag
        close = text.find(CLOSE, end)
        if close >= 0 and OPEN not in text[end:close]:
            junk = text[end:close].strip()
            return _invalid(
                "",
                text[k:close].strip(),
                f"unexpected text {junk[:40]!r} after the JSON of the tool call. Write it as {CALL_SYNTAX}",
            ), close + len(CLOSE)
        return _call_from_object(obj, body, schemas), end  # unterminated: still read it
    return _call_from_object(obj, body, schemas), m.end()


def parse_reply(text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParsedReply:
    """Split a reply into tool calls and plain text. An unterminated `<tool_call>` is still
    read (the model may stop right after the JSON); a stray `</tool_call>` with no opening tag
    counts as a malformed call, so the model learns it was not executed."""
    calls: list[ToolCall] = []
    plain: list[str] = []
    pos = 0
    while (i := text.find(OPEN, pos)) >= 0:
        plain.append(text[pos:i])
        call, pos = _read_block(text, i + len(OPEN), schemas)
        calls.append(call)
    plain.append(text[pos:])
    rest = "".join(plain)
    if CLOSE in rest:
        calls.append(
            _invalid(
                "",
                rest.strip()[:200],
                f"found {CLOSE} without a matching {OPEN}. Write it as {CALL_SYNTAX}",
            )
        )
        rest = rest.replace(CLOSE, "")
    return ParsedReply(tuple(calls), rest.strip())
