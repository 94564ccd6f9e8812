"""multi: the calculate_output formula (parsed without eval) and agentrft's gate."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from agentrft.errors import ConfigError
from agentrft.graders import build_grader, sample_from_text
from agentrft.graders.multi import Formula, FormulaError


def ev(text: str, **env: float) -> float:
    return Formula(text).evaluate(env)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("10 - 4 - 3", 3.0),  # left-associative
        ("24 / 4 / 3", 2.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative: 2^(3^2)
        ("-2 ^ 2", -4.0),  # unary minus binds looser than ^
        ("2 ^ -1", 0.5),
        ("--3", 3.0),
        ("-(1 + 2) * 2", -6.0),
        ("+4", 4.0),
        ("3 * -2", -6.0),
        ("1e-1 * 10", 1.0),
        (".5 + .25", 0.75),
        ("min(3, 1, 2) + max(4)", 5.0),
        ("abs(-2.5)", 2.5),
        ("floor(2.7) + ceil(2.1)", 5.0),
        ("exp(0) + sqrt(16) + log(exp(2))", 7.0),
        ("max(min(a, 1), 0)", 0.7),
        ("0.5 * a + 0.5 * b", 0.45),
    ],
)
def test_evaluation(text: str, expected: float) -> None:
    assert ev(text, a=0.7, b=0.2) == pytest.approx(expected)


def test_names_are_collected() -> None:
    assert Formula("0.5 * tests + style ^ 2 - min(tests, x)").names == {"tests", "style", "x"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1 +", "ends too early"),
        ("(1 + 2", "missing '\\)'"),
        ("1 2", "unexpected '2'"),
        ("a ** 2", "unexpected '\\*'"),
        ("a % 2", "unexpected character '%'"),
        ("pow(2, 3)", "unknown function 'pow'"),
        ("sqrt(1, 2)", "exactly one argument"),
        ("min()", "one or more arguments"),
        ("max + 1", "max is a function"),
        ("__import__(os)", "unknown function '__import__'"),
        ("__import__('os')", 'unexpected character "\'"'),
        ("", "ends too early"),
    ],
)
def test_parse_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Formula(text)


@pytest.mark.parametrize(
    "text", ["a / b", "log(b)", "sqrt(b - 1)", "exp(1000)", "10 ^ 400", "(0 - 8) ^ 0.5"]
)
def test_math_errors_raise_formula_error(text: str) -> None:
    with pytest.raises(FormulaError):
        ev(text, a=1.0, b=0.0)


def sc(value: str, operation: str = "eq") -> dict[str, Any]:
    """A string_check sub-grader scoring 1 when the output equals `value` (or, with
    operation "like", contains it)."""
    return {
        "type": "string_check",
        "name": value,
        "input": "{{sample.output_text}}",
        "reference": value,
        "operation": operation,
    }


def like(value: str) -> dict[str, Any]:
    return sc(value, "like")


def test_multi_combines_sub_scores() -> None:
    g = build_grader(
        {
            "type": "multi",
            "name": "m",
            "graders": {"a": like("x"), "b": like("y")},
            "calculate_output": "0.25 * a + 0.75 * b",
        }
    )
    grade = g.grade(sample_from_text("only y"), {})
    assert grade.score == 0.75
    assert grade.sub_scores == {"a": 0.0, "b": 1.0}


def test_a_full_score_made_of_tenths_is_exactly_1() -> None:
    """0.7 + 0.2 + 0.1 is 0.9999999999999999 in floats; a pass at threshold 1 must count."""
    g = build_grader(
        {
            "type": "multi",
            "graders": {"a": like("x"), "b": like("y"), "c": like("z")},
            "calculate_output": "a * (0.7 + 0.2 * b + 0.1 * c)",
        }
    )
    assert 0.7 + 0.2 * 1.0 + 0.1 * 1.0 < 1.0
    assert g.grade(sample_from_text("x y z"), {}).score == 1.0


def test_agrade_matches_grade() -> None:
    g = build_grader(
        {
            "type": "multi",
            "graders": {"a": like("x"), "b": like("y")},
            "calculate_output": "a + 2 * b",
        }
    )
    sample = sample_from_text("x and y")
    assert asyncio.run(g.agrade(sample, {})).score == 3.0
    assert g.grade(sample, {}).score == 3.0


def test_division_by_zero_is_flagged_not_scored() -> None:
    g = build_grader(
        {"type": "multi", "graders": {"a": like("x"), "b": like("y")}, "calculate_output": "a / b"}
    )
    grade = g.grade(sample_from_text("x"), {})
    assert grade.error == "formula_runtime_error"
    assert math.isnan(grade.score)
    assert grade.sub_scores == {"a": 1.0, "b": 0.0}


def test_unknown_formula_name_lists_the_sub_graders() -> None:
    with pytest.raises(
        ConfigError,
        match=r"grader\.calculate_output: unknown name\(s\) styel .*the sub-graders are: tests, style",
    ):
        build_grader(
            {
                "type": "multi",
                "graders": {"tests": like("x"), "style": like("y")},
                "calculate_output": "tests + styel",
            }
        )


def test_sub_grader_error_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"grader\.graders\.b\.operation"):
        build_grader(
            {
                "type": "multi",
                "graders": {"a": like("x"), "b": {**like("y"), "operation": "regex"}},
                "calculate_output": "a + b",
            }
        )
    with pytest.raises(ConfigError, match="cannot appear in a formula"):
        build_grader(
            {"type": "multi", "graders": {"my-grader": like("x")}, "calculate_output": "1"}
        )


def test_sub_grader_error_flags_the_whole_grade() -> None:
    g = build_grader(
        {
            "type": "multi",
            "graders": {"a": like("x"), "b": {**like("y"), "reference": "{{item.missing}}"}},
            "calculate_output": "a + b",
        }
    )
    grade = g.grade(sample_from_text("x"), {})
    assert grade.error == "invalid_variable_error"
    assert "sub-grader 'b'" in grade.metrics["error_details"]
    assert math.isnan(grade.score)


def test_nested_multi_flattens_sub_scores() -> None:
    inner = {
        "type": "multi",
        "graders": {"p": like("p"), "q": like("q")},
        "calculate_output": "(p + q) / 2",
    }
    g = build_grader(
        {
            "type": "multi",
            "graders": {"inner": inner, "r": like("r")},
            "calculate_output": "inner * r",
        }
    )
    grade = g.grade(sample_from_text("p r"), {})
    assert grade.score == 0.5
    assert grade.sub_scores == {"inner": 0.5, "inner.p": 1.0, "inner.q": 0.0, "r": 1.0}


class TestGate:
    SPEC = {
        "type": "multi",
        "name": "gated",
        "graders": {"style": like("tidy"), "tests": like("PASS")},
        "calculate_output": "0.8 * tests + 0.2 * style",
        "gate": {"grader": "tests", "threshold": 1.0},
    }

    def test_gate_failed_skips_later_graders_and_gives_on_fail(self) -> None:
        grade = build_grader(self.SPEC).grade(sample_from_text("FAIL but tidy"), {})
        assert grade.score == 0.0
        assert grade.sub_scores == {"tests": 0.0}  # style was never run
        assert grade.metrics["gate"] == "failed"

    def test_gate_passed_uses_the_formula(self) -> None:
        g = build_grader(self.SPEC)
        for grade in (
            g.grade(sample_from_text("PASS, tidy"), {}),
            asyncio.run(g.agrade(sample_from_text("PASS, tidy"), {})),
        ):
            assert grade.score == pytest.approx(1.0)
            assert grade.metrics["gate"] == "passed"
        assert g.grade(sample_from_text("PASS, messy"), {}).score == pytest.approx(0.8)

    def test_on_fail_formula_over_the_gate(self) -> None:
        spec = {
            **self.SPEC,
            "graders": {
                "style": like("tidy"),
                "tests": {"type": "file_f1", "reference": ["a.py", "b.py"]},
            },
            "gate": {"grader": "tests", "threshold": 1.0, "on_fail": "0.5 * tests"},
        }
        grade = build_grader(spec).grade(sample_from_text("a.py"), {})
        assert grade.score == pytest.approx(0.5 * 2 / 3)

    def test_on_fail_grades_only_the_sub_graders_it_names(self) -> None:
        """A failing rollout can pay for its calls: `budget - 1` grades the budget (and
        nothing else) when the gate fails; nothing it names can lift it above the formula."""
        budget = {"type": "tool_budget", "cost_per_call": 0.1, "free_calls": 1, "grader": like("")}
        spec = {
            **self.SPEC,
            "graders": {"style": like("tidy"), "tests": like("PASS"), "budget": budget},
            "calculate_output": "tests * budget",
            "gate": {"grader": "tests", "threshold": 1.0, "on_fail": "budget - 1"},
        }
        g = build_grader(spec)
        sample = sample_from_text("FAIL but tidy")
        sample["tool_calls"] = [{"name": "apply", "arguments": "{}"}] * 4
        for grade in (g.grade(sample, {}), asyncio.run(g.agrade(sample, {}))):
            assert grade.score == pytest.approx(-0.3)
            assert set(grade.sub_scores) >= {"tests", "budget"} and "style" not in grade.sub_scores
        sample["tool_calls"] = sample["tool_calls"][:1]
        assert g.grade(sample, {}).score == 0.0

    def test_on_fail_names_only_sub_graders(self) -> None:
        with pytest.raises(ConfigError, match=r"on_fail: unknown name\(s\) stlye; the sub-graders"):
            build_grader({**self.SPEC, "gate": {"grader": "tests", "on_fail": "stlye"}})

    def test_gate_must_name_a_sub_grader(self) -> None:
        with pytest.raises(
            ConfigError,
            match=r"grader\.gate\.grader: 'test' is not a sub-grader; use one of: style, tests",
        ):
            build_grader({**self.SPEC, "gate": {"grader": "test"}})
