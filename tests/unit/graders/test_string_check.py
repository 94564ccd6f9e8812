"""string_check: eq, ne, like, ilike, exactly as OpenAI defines them."""

from __future__ import annotations

import pytest

from agentrft.errors import ConfigError
from agentrft.graders import build_grader, sample_from_text


def check(op: str, output: str, reference: str) -> float:
    g = build_grader(
        {
            "type": "string_check",
            "name": "s",
            "input": "{{sample.output_text}}",
            "reference": "{{item.ref}}",
            "operation": op,
        }
    )
    grade = g.grade(sample_from_text(output), {"ref": reference})
    assert grade.error is None
    return grade.score


@pytest.mark.parametrize(
    ("op", "output", "reference", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("eq", "Paris.", "Paris", 0.0),
        ("ne", "Lyon", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is paris.", "Paris", 0.0),
        ("ilike", "The capital is PARIS.", "paris", 1.0),
        ("ilike", "The capital is Lyon.", "paris", 0.0),
    ],
)
def test_operations(op: str, output: str, reference: str, expected: float) -> None:
    assert check(op, output, reference) == expected


def test_openai_tool_call_example_shape() -> None:
    """OpenAI's guide grades `sample.output_tools[0].function.name` with a literal input."""
    g = build_grader(
        {
            "type": "multi",
            "graders": {
                "function_name": {
                    "name": "function_name",
                    "type": "string_check",
                    "input": "get_acceptors",
                    "reference": "{{sample.output_tools[0].function.name}}",
                    "operation": "eq",
                },
                "arguments": {
                    "name": "arguments",
                    "type": "string_check",
                    "input": '{"smiles": "{{item.smiles}}"}',
                    "reference": "{{sample.output_tools[0].function.arguments}}",
                    "operation": "eq",
                },
            },
            "calculate_output": "0.5 * function_name + 0.5 * arguments",
        }
    )
    sample = sample_from_text("")
    sample["output_tools"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_acceptors", "arguments": '{"smiles": "CCO"}'},
        }
    ]
    assert g.grade(sample, {"smiles": "CCO"}).score == 1.0
    assert g.grade(sample, {"smiles": "CCC"}).score == 0.5


def test_unknown_operation_fails_validation_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"grader\.operation.*'eq', 'ne', 'like' or 'ilike'"):
        build_grader(
            {"type": "string_check", "input": "a", "reference": "b", "operation": "contains"}
        )
    with pytest.raises(ConfigError, match='"neq" is written "ne"'):
        build_grader({"type": "string_check", "input": "a", "reference": "b", "operation": "neq"})
