"""`{{ item.x }}` / `{{ sample.x }}` templating, as OpenAI's graders define it.

Paths use JSON-path-like steps: `{{item.a.b}}`, `{{sample.output_tools[0].function.name}}`,
`{{item["key with spaces"]}}`. A value that is not a string renders as JSON.

Missing values are judged by whose fault they are:
- a missing **sample** path (the model wrote no JSON, or no tool call) renders as "" and is
  graded normally: that is the model's doing and should score low;
- a missing **item** path is a grader/dataset mismatch: `MissingItemField` is raised and
  graders turn it into the `invalid_variable_error` flag (the sample is excluded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from agentrft.errors import ConfigError

NAMESPACES = ("item", "sample")
_PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
_STEP = re.compile(
    r"""\.\s*([A-Za-z_][A-Za-z0-9_\-]*)|\[\s*(-?\d+)\s*\]|\[\s*(?:"([^"]*)"|'([^']*)')\s*\]"""
)
_HEAD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MISSING = object()


class MissingItemField(LookupError):
    """A template names an item field that this row does not have."""


def parse_path(expr: str) -> tuple[str, tuple[str | int, ...]]:
    """`item.a[0].b` -> ("item", ("a", 0, "b")). Raises ValueError on bad syntax."""
    head = _HEAD.match(expr)
    if head is None:
        raise ValueError(f"{{{{{expr}}}}} must start with a namespace such as `item` or `sample`")
    steps: list[str | int] = []
    pos = head.end()
    while pos < len(expr):
        m = _STEP.match(expr, pos)
        if m is None:
            raise ValueError(
                f"cannot read {{{{{expr}}}}} at {expr[pos:]!r}; write paths like item.a.b or sample.output_tools[0].function.name"
            )
        name, index, dq, sq = m.groups()
        steps.append(
            int(index)
            if index is not None
            else name
            if name is not None
            else (dq if dq is not None else sq)
        )
        pos = m.end()
    return head.group(0), tuple(steps)


def check_template(text: str, where: str, namespaces: Iterable[str] = NAMESPACES) -> None:
    """Validation: every placeholder parses and names an allowed namespace."""
    allowed = tuple(namespaces)
    for m in _PLACEHOLDER.finditer(text):
        try:
            ns, _ = parse_path(m.group(1))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if ns not in allowed:
            raise ConfigError(
                f"{where}: unknown namespace {ns!r} in {m.group(0)}; use one of {', '.join(allowed)} (e.g. {{{{item.answer}}}})"
            )


def _lookup(root: Any, steps: tuple[str | int, ...]) -> Any:
    value = root
    for step in steps:
        if isinstance(step, int):
            if not isinstance(value, list | tuple) or not -len(value) <= step < len(value):
                return _MISSING
            value = value[step]
        else:
            if not isinstance(value, Mapping) or step not in value:
                return _MISSING
            value = value[step]
    return value


def resolve(expr: str, namespaces: Mapping[str, Any]) -> Any:
    """The raw value a placeholder names (None for a missing sample path)."""
    ns, steps = parse_path(expr)
    if ns not in namespaces:
        raise ValueError(f"unknown namespace {ns!r}")
    value = _lookup(namespaces[ns], steps)
    if value is _MISSING:
        if ns == "sample":
            return None
        raise MissingItemField(
            f"{{{{{expr}}}}}: the {ns} has no such field (it has: {', '.join(map(str, namespaces[ns])) if isinstance(namespaces[ns], Mapping) else type(namespaces[ns]).__name__})"
        )
    return value


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def render(text: str, namespaces: Mapping[str, Any]) -> str:
    """Substitute every placeholder in `text`."""
    return _PLACEHOLDER.sub(lambda m: as_text(resolve(m.group(1), namespaces)), text)


def render_value(text: Any, namespaces: Mapping[str, Any]) -> Any:
    """Like `render`, but a string that is exactly one placeholder yields the raw value (a
    list stays a list); anything that is not a string is returned as is."""
    if not isinstance(text, str):
        return text
    m = _PLACEHOLDER.fullmatch(text.strip())
    if m is not None:
        return resolve(m.group(1), namespaces)
    return render(text, namespaces)


def render_input_and_reference(
    spec: Any, sample: Mapping[str, Any], item: Mapping[str, Any]
) -> tuple[str, str]:
    """The two texts a comparing grader (string_check, text_similarity) compares: its
    `input` and `reference` templates rendered. A missing item field raises MissingItemField."""
    namespaces = {"sample": sample, "item": item}
    return render(spec.input, namespaces), render(spec.reference, namespaces)
