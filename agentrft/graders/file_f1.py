"""`file_f1` (agentrft): set F1 of the paths a rollout selected against the expected ones.

    {"type": "file_f1", "name": "files", "input": "{{sample.output_text}}",
     "reference": "{{item.files}}"}

`input` is read as a JSON list of paths when it is one; otherwise it is split on newlines,
commas and whitespace, with list bullets, numbering, backticks and quotes stripped and
`./` normalised away. `reference` is a list (templated straight from the item) or a string
read the same way. Both sets empty scores 1.0; exactly one empty scores 0.0.
Example: selected {src/auth.py, README.md} vs expected {src/auth.py, tests/test_auth.py}
-> precision 0.5, recall 0.5, F1 0.5.

With `"grounded": true` a selected path counts as a hit only when one of this rollout's own
successful tool calls returned it (a word of its output: `path  (matches: ...)`,
`path:12: text`, one path per line). A path copied from a worked example, or guessed, is
then a miss even when it is right: the model is paid for reading its tools, not for
recalling the prompt.

With `"resolve_numbers": true` a number in the answer (`[1, 3]`, or `1, 3`) names a line of
the rollout's last successful tool output that numbers its paths (`1. src/app.py ...`), as
agentrft's code `search` tool does; the number is replaced by that path before scoring. A
number with no such line stays a miss.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from agentrft.graders.protocol import LocalGrader, failed
from agentrft.graders.spec import BuildContext, Strict
from agentrft.graders.template import (
    MissingItemField,
    as_text,
    check_template,
    render,
    render_value,
)
from agentrft.types import Grade

_SPLIT = re.compile(r"[\s,]+")
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d+[.)])(?=\s|$)")
_STRIP = "`'\"[](){}<>;:"


class FileF1Spec(Strict):
    type: Literal["file_f1"]
    name: str = "file_f1"
    input: str = "{{sample.output_text}}"
    reference: str | list[str]
    grounded: bool = False
    resolve_numbers: bool = False


def normalize_path(raw: str) -> str:
    p = raw.strip().strip(_STRIP).strip()
    if p.endswith(".") and not p.endswith(".."):  # "... and README.md." ends a sentence
        p = p.rstrip(".")
    if not p:
        return ""
    p = posixpath.normpath(p.replace("\\", "/"))
    return "" if p == "." else p


def parse_paths(value: Any) -> set[str]:
    """Paths from a list, a JSON list, or free text (one path per line/comma/space)."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            decoded = None
        if isinstance(decoded, list):
            value = decoded
    if isinstance(value, list | tuple):
        return {p for p in (normalize_path(as_text(v)) for v in value) if p}
    paths: set[str] = set()
    for line in as_text(value).splitlines():
        if line.strip().startswith("```"):
            continue
        line = _BULLET.sub("", line.strip())
        paths.update(p for p in (normalize_path(t) for t in _SPLIT.split(line)) if p)
    return paths


def set_f1(
    selected: Iterable[str], expected: Iterable[str], can_hit: set[str] | None = None
) -> tuple[float, float, float]:
    """(f1, precision, recall); 1.0 for two empty sets. With `can_hit`, only those paths
    count as hits; the other selected paths still count against precision."""
    s, e = set(selected), set(expected)
    if not s and not e:
        return 1.0, 1.0, 1.0
    hit = len(s & e & can_hit) if can_hit is not None else len(s & e)
    precision = hit / len(s) if s else 0.0
    recall = hit / len(e) if e else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return f1, precision, recall


_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+(\S+)", re.MULTILINE)


def numbered_paths(sample: Mapping[str, Any]) -> dict[str, str]:
    """ "N" -> path from the last successful tool output with numbered lines."""
    for call in reversed(sample.get("tool_calls") or []):
        if (
            isinstance(call, Mapping)
            and call.get("status") == "ok"
            and isinstance(call.get("output"), str)
        ):
            lines = {n: normalize_path(path) for n, path in _NUMBERED.findall(call["output"])}
            if lines:
                return lines
    return {}


def returned_paths(sample: Mapping[str, Any]) -> set[str]:
    """Every path-like word in the outputs of the rollout's successful tool calls."""
    seen: set[str] = set()
    for call in sample.get("tool_calls") or []:
        if (
            isinstance(call, Mapping)
            and call.get("status") == "ok"
            and isinstance(call.get("output"), str)
        ):
            for token in re.split(r"[\s:]+", call["output"]):
                path = normalize_path(token)
                if path:
                    seen.add(path)
    return seen


class FileF1Grader(LocalGrader[FileF1Spec]):
    type = "file_f1"

    def _grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Grade:
        ns = {"sample": sample, "item": item}
        try:
            selected = parse_paths(render_value(self.spec.input, ns))
            ref = self.spec.reference
            expected = parse_paths(
                [render(r, ns) for r in ref] if isinstance(ref, list) else render_value(ref, ns)
            )
        except MissingItemField as exc:
            return failed("invalid_variable_error", str(exc))
        if self.spec.resolve_numbers:
            lines = numbered_paths(sample)
            selected = {lines.get(p, p) if p.isdigit() else p for p in selected}
        details: dict[str, Any] = {"selected": sorted(selected), "expected": sorted(expected)}
        found = None
        if self.spec.grounded:
            found = returned_paths(sample)
            details["ungrounded"] = sorted(selected - found)
        f1, precision, recall = set_f1(selected, expected, can_hit=found)
        return Grade(f1, {"precision": precision, "recall": recall}, details)


def build(spec: FileF1Spec, path: str, ctx: BuildContext) -> FileF1Grader:
    check_template(spec.input, f"{path}.input")
    for i, r in enumerate([spec.reference] if isinstance(spec.reference, str) else spec.reference):
        check_template(
            r, f"{path}.reference" + ("" if isinstance(spec.reference, str) else f"[{i}]")
        )
    return FileF1Grader(spec)
