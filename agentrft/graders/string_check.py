"""`string_check` (OpenAI): 1.0 or 0.0 from comparing two templated strings.

    {"type": "string_check", "name": "...", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "operation": "eq" | "ne" | "like" | "ilike"}

eq/ne: exact (in)equality, case-sensitive. like: input contains reference. ilike: the same,
case-insensitive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import field_validator

from agentrft.graders.protocol import LocalGrader
from agentrft.graders.spec import BuildContext, Strict
from agentrft.graders.template import check_template, render_input_and_reference
from agentrft.types import Grade


class StringCheckSpec(Strict):
    type: Literal["string_check"]
    name: str = "string_check"
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]

    @field_validator("operation", mode="before")
    @classmethod
    def _hint(cls, v: Any) -> Any:
        if v == "neq":
            raise ValueError('"neq" is written "ne" in the grader JSON')
        return v


def compare(operation: str, text: str, reference: str) -> bool:
    if operation == "eq":
        return text == reference
    if operation == "ne":
        return text != reference
    if operation == "like":
        return reference in text
    return reference.casefold() in text.casefold()  # ilike


class StringCheckGrader(LocalGrader[StringCheckSpec]):
    type = "string_check"

    def _grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Grade:
        # a missing item field raises MissingItemField, which grade_safely flags
        text, ref = render_input_and_reference(self.spec, sample, item)
        return Grade(1.0 if compare(self.spec.operation, text, ref) else 0.0)


def build(spec: StringCheckSpec, path: str, ctx: BuildContext) -> StringCheckGrader:
    check_template(spec.input, f"{path}.input")
    check_template(spec.reference, f"{path}.reference")
    return StringCheckGrader(spec)
