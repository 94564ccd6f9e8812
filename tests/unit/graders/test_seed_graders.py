"""The seed's graders: file_f1, fact_recall, tool_budget, with the seed's examples verbatim."""

from __future__ import annotations

import asyncio

import pytest

from agentrft.graders import build_grader, sample_from_text, sample_from_trajectory, tool_call_limit
from agentrft.graders.file_f1 import parse_paths, set_f1
from agentrft.types import StopReason

from .conftest import make_trajectory

FILE_F1 = {
    "type": "file_f1",
    "name": "files",
    "input": "{{sample.output_text}}",
    "reference": "{{item.files}}",
}


class TestFileF1:
    def test_seed_example(self) -> None:
        """selected {src/auth.py, README.md} vs expected {src/auth.py, tests/test_auth.py} -> 0.5"""
        g = build_grader(FILE_F1)
        grade = g.grade(
            sample_from_text('["src/auth.py", "README.md"]'),
            {"files": ["src/auth.py", "tests/test_auth.py"]},
        )
        assert grade.score == 0.5
        assert grade.sub_scores == {"precision": 0.5, "recall": 0.5}

    def test_both_empty_is_one_and_one_empty_is_zero(self) -> None:
        g = build_grader(FILE_F1)
        assert g.grade(sample_from_text("[]"), {"files": []}).score == 1.0
        assert g.grade(sample_from_text(""), {"files": []}).score == 1.0
        assert g.grade(sample_from_text("src/a.py"), {"files": []}).score == 0.0
        assert g.grade(sample_from_text(""), {"files": ["src/a.py"]}).score == 0.0

    @pytest.mark.parametrize(
        "text",
        [
            '["src/auth.py", "./README.md"]',
            "src/auth.py\nREADME.md",
            "src/auth.py, README.md",
            "src/auth.py README.md",
            "- `src/auth.py`\n- ./README.md",
            "1. src/auth.py\n2. README.md.",
            "* 'src/auth.py'\n* \"README.md\"",
            "```\nsrc/auth.py\nREADME.md\n```",
            "src//auth.py\nREADME.md",
        ],
    )
    def test_input_formats(self, text: str) -> None:
        assert parse_paths(text) == {"src/auth.py", "README.md"}

    def test_reference_as_string_or_list_of_templates(self) -> None:
        g = build_grader({**FILE_F1, "reference": "{{item.expected}}"})
        assert g.grade(sample_from_text("a.py\nb.py"), {"expected": "a.py, b.py"}).score == 1.0
        g2 = build_grader({**FILE_F1, "reference": ["{{item.main}}", "tests/test_main.py"]})
        assert g2.grade(sample_from_text("main.py"), {"main": "main.py"}).score == pytest.approx(
            2 / 3
        )

    def test_set_f1_values(self) -> None:
        assert set_f1({"a", "b", "c"}, {"a"}) == pytest.approx((0.5, 1 / 3, 1.0))
        assert set_f1({"x"}, {"y"}) == (0.0, 0.0, 0.0)


class TestFactRecall:
    SPEC = {
        "type": "fact_recall",
        "name": "facts",
        "input": "{{sample.output_text}}",
        "reference": "{{item.facts}}",
    }

    def test_share_of_facts_found(self) -> None:
        g = build_grader(self.SPEC)
        grade = g.grade(
            sample_from_text("The capital is PARIS; the currency is the Euro."),
            {"facts": ["capital is Paris", "currency is the euro", "population is 2 million"]},
        )
        assert grade.score == pytest.approx(2 / 3)
        assert grade.metrics["missing"] == ["population is 2 million"]

    def test_word_boundaries_and_normalisation(self) -> None:
        g = build_grader(self.SPEC)
        assert (
            g.grade(sample_from_text("Cats-and-dogs."), {"facts": ["cats and dogs"]}).score == 1.0
        )
        assert g.grade(sample_from_text("concatenate"), {"facts": ["cat"]}).score == 0.0

    def test_facts_as_lines_and_no_facts(self) -> None:
        g = build_grader(self.SPEC)
        assert g.grade(sample_from_text("alpha beta"), {"facts": "alpha\n\ngamma\n"}).score == 0.5
        assert g.grade(sample_from_text("anything"), {"facts": []}).score == 1.0

    def test_path_precision_divides_the_credit_among_the_paths_stated(self) -> None:
        g = build_grader({**self.SPEC, "path_precision": True})
        item = {"facts": ["src/app/config.py"]}
        hedge = g.grade(sample_from_text("src/app/net.py or src/app/config.py."), item)
        assert hedge.score == 0.5 and hedge.metrics["extra_paths"] == ["src/app/net.py"]
        assert g.grade(sample_from_text("In src/app/config.py."), item).score == 1.0
        # without the option, or on a row whose facts name no path, paths cost nothing
        assert (
            build_grader(self.SPEC)
            .grade(sample_from_text("src/app/net.py or src/app/config.py"), item)
            .score
            == 1.0
        )
        other = g.grade(
            sample_from_text("It returns Table (see src/app/view.py)."), {"facts": ["Table"]}
        )
        assert other.score == 1.0 and "extra_paths" not in other.metrics


class TestToolBudget:
    SPEC = {
        "type": "tool_budget",
        "name": "budget",
        "max_tool_calls": 10,
        "grader": {"type": "file_f1", "reference": ["a.py", "b.py"]},
    }

    def test_seed_example_over_budget(self) -> None:
        """Cutoff 10: a rollout reaching an 11th call scores -1 (the engine stops it there)."""
        calls = [[("grep", {"q": str(i)})] for i in range(10)]
        traj = make_trajectory(
            "", calls, final_calls=[("grep", {"q": "one more"})], stop=StopReason.MAX_TOOL_CALLS
        )
        grade = build_grader(self.SPEC).grade(sample_from_trajectory(traj), {})
        assert grade.score == -1.0
        assert grade.sub_scores == {"tool_calls": 11.0}
        assert grade.metrics["over_budget"] is True

    def test_seed_example_within_budget_gets_inner_score(self) -> None:
        """A rollout that reaches a final answer with <= 10 calls gets its inner score."""
        calls = [[("grep", {"q": str(i)})] for i in range(10)]
        traj = make_trajectory("a.py\nc.py\nd.py", calls)  # F1 of {a,c,d} vs {a,b} = 0.4
        spec = {
            **self.SPEC,
            "grader": {
                "type": "multi",
                "graders": {"f": {"type": "file_f1", "reference": ["a.py", "b.py"]}},
                "calculate_output": "f + 0.3",
            },
        }
        grade = build_grader(spec).grade(sample_from_trajectory(traj), {})
        assert grade.score == pytest.approx(0.7)
        assert grade.sub_scores["tool_calls"] == 10.0
        assert asyncio.run(
            build_grader(spec).agrade(sample_from_trajectory(traj), {})
        ).score == pytest.approx(0.7)

    def test_invalid_calls_count_too(self) -> None:
        traj = make_trajectory("a.py", [[("grep", {})]])
        sample = sample_from_trajectory(traj)
        sample["tool_calls"].append(
            {"name": "", "arguments": {}, "output": "Error: not JSON", "status": "invalid_call"}
        )
        assert build_grader({**self.SPEC, "max_tool_calls": 1}).grade(sample, {}).score == -1.0

    def test_tool_call_limit_finds_the_budget_anywhere(self) -> None:
        assert tool_call_limit(build_grader(self.SPEC)) == 10
        nested = {
            "type": "multi",
            "graders": {
                "x": {**self.SPEC, "max_tool_calls": 4},
                "y": {"type": "string_check", "input": "a", "reference": "a", "operation": "eq"},
            },
            "calculate_output": "x + y",
        }
        assert tool_call_limit(build_grader(nested)) == 4
        assert tool_call_limit(build_grader(FILE_F1)) is None
