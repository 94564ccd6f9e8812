"""`{{item.x}}` / `{{sample.x}}` templating: paths, rendering, and whose fault a gap is."""

from __future__ import annotations

import pytest

from agentrft.errors import ConfigError
from agentrft.graders import build_grader, sample_from_text
from agentrft.graders.template import (
    MissingItemField,
    check_template,
    parse_path,
    render,
    render_value,
)

NS = {
    "item": {"a": {"b": "deep"}, "list": [1, 2, {"k": "v"}], "odd key": "spaced", "n": 3},
    "sample": {
        "output_json": {"x": {"y": "why"}},
        "output_tools": [{"function": {"name": "grep", "arguments": '{"q": 1}'}}],
    },
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{item.a.b}}", "deep"),
        ("{{ item.a.b }}", "deep"),
        ("{{item.list[2].k}}", "v"),
        ("{{item.list[-1].k}}", "v"),
        ('{{item["odd key"]}}', "spaced"),
        ("{{sample.output_json.x.y}}", "why"),
        ("{{sample.output_tools[0].function.name}}", "grep"),
        ("n={{item.n}}, a={{item.a}}", 'n=3, a={"b": "deep"}'),
        ("{{item.list}}", '[1, 2, {"k": "v"}]'),
        ("no placeholders", "no placeholders"),
    ],
)
def test_render_paths(template: str, expected: str) -> None:
    assert render(template, NS) == expected


def test_render_value_keeps_raw_values_for_a_single_placeholder() -> None:
    assert render_value("{{item.list}}", NS) == [1, 2, {"k": "v"}]
    assert render_value(" {{ item.n }} ", NS) == 3
    assert render_value("x{{item.n}}", NS) == "x3"


def test_missing_sample_path_renders_empty_but_missing_item_field_raises() -> None:
    assert render("[{{sample.output_json.nope}}]", NS) == "[]"
    assert render("[{{sample.output_tools[5].function.name}}]", NS) == "[]"
    with pytest.raises(MissingItemField, match="item has no such field"):
        render("{{item.nope}}", NS)


def test_parse_path_and_validation_errors() -> None:
    assert parse_path("item.a[0]['b c'].d") == ("item", ("a", 0, "b c", "d"))
    with pytest.raises(ValueError, match="cannot read"):
        parse_path("item.a[")
    with pytest.raises(ConfigError, match="unknown namespace 'items'"):
        check_template("{{items.answer}}", "grader.input")
    with pytest.raises(ConfigError, match=r"grader\.reference: cannot read"):
        check_template("{{item.a..b}}", "grader.reference")


def test_missing_item_field_is_flagged_not_scored() -> None:
    g = build_grader(
        {
            "type": "string_check",
            "name": "s",
            "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}",
            "operation": "eq",
        }
    )
    grade = g.grade(sample_from_text("Paris"), {"answr": "Paris"})
    assert grade.error == "invalid_variable_error"
    assert grade.score != grade.score  # NaN: never a silent 0
    assert "answr" in grade.metrics["error_details"]
