"""Validation messages, pickling, the job hook, and `agentrft grader validate|run`."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from agentrft.cli import main
from agentrft.errors import ConfigError
from agentrft.graders import KNOWN_TYPES, build_grader, sample_from_text, validate_grader
from agentrft.job import job_from_dict

ALL_TYPES = {
    "string_check": {
        "type": "string_check",
        "name": "s",
        "input": "{{sample.output_text}}",
        "reference": "x",
        "operation": "eq",
    },
    "text_similarity": {
        "type": "text_similarity",
        "name": "t",
        "input": "{{sample.output_text}}",
        "reference": "x",
        "evaluation_metric": "rouge_l",
        "pass_threshold": 0.5,
    },
    "score_model": {
        "type": "score_model",
        "name": "m",
        "model": "smollm2-135m-instruct",
        "input": [{"role": "user", "content": "{{sample.output_text}}"}],
    },
    "label_model": {
        "type": "label_model",
        "name": "l",
        "model": "smollm2-135m-instruct",
        "input": [{"role": "user", "content": "x"}],
        "labels": ["a", "b"],
        "passing_labels": ["a"],
    },
    "python": {
        "type": "python",
        "name": "p",
        "source": "def grade(sample, item):\n    return 1.0\n",
        "image_tag": "2025-05-08",
    },
    "endpoint": {
        "type": "endpoint",
        "name": "e",
        "url": "http://127.0.0.1:9/grade",
        "rate_limit": 5,
    },
    "file_f1": {"type": "file_f1", "name": "f", "reference": "{{item.files}}"},
    "fact_recall": {"type": "fact_recall", "name": "r", "reference": ["a"]},
}
ALL_TYPES["tool_budget"] = {
    "type": "tool_budget",
    "name": "b",
    "max_tool_calls": 3,
    "grader": ALL_TYPES["file_f1"],
}
ALL_TYPES["multi"] = {
    "type": "multi",
    "name": "m",
    "graders": {k: v for k, v in ALL_TYPES.items()},
    "calculate_output": " + ".join(ALL_TYPES),
    "gate": {"grader": "string_check", "threshold": 1},
}


def test_every_type_builds_and_is_picklable() -> None:
    assert set(ALL_TYPES) == set(KNOWN_TYPES)
    for kind, spec in ALL_TYPES.items():
        g = build_grader(spec)
        clone = pickle.loads(pickle.dumps(g))
        assert (clone.type, clone.name) == (kind, spec["name"])
    clone = pickle.loads(pickle.dumps(build_grader(ALL_TYPES["multi"])))
    grade = clone.grade(sample_from_text("not x"), {"files": []})  # gate fails: nothing else runs
    assert grade.score == 0.0 and grade.metrics["gate"] == "failed"


def test_unknown_type_lists_the_known_types() -> None:
    with pytest.raises(
        ConfigError,
        match="unknown type 'regex'; known grader types: string_check, text_similarity, score_model, label_model, python, multi, endpoint, file_f1, fact_recall, tool_budget",
    ):
        validate_grader({"type": "regex"})
    with pytest.raises(ConfigError, match=r"grader\.graders\.a: no \"type\""):
        validate_grader({"type": "multi", "graders": {"a": {}}, "calculate_output": "a"})


def test_field_errors_name_the_path_and_the_fix() -> None:
    with pytest.raises(ConfigError) as exc:
        validate_grader(
            {
                "type": "tool_budget",
                "max_tool_calls": 2,
                "grader": {"type": "string_check", "input": "a", "operaton": "eq"},
            }
        )
    msg = str(exc.value)
    assert "`grader.grader.reference`: Field required -> add this field" in msg
    assert (
        "`grader.grader.operaton`: Extra inputs are not permitted -> remove it or check its spelling"
        in msg
    )
    with pytest.raises(
        ConfigError,
        match=r"`grader\.evaluation_metric`: Input should be 'fuzzy_match'.*-> use one of the values listed",
    ):
        validate_grader({**ALL_TYPES["text_similarity"], "evaluation_metric": "rouge"})


def test_job_validates_its_grader_and_takes_a_judge_block() -> None:
    job = {
        "training_file": "t.jsonl",
        "method": {"type": "reinforcement", "reinforcement": {"grader": ALL_TYPES["file_f1"]}},
        "agentrft": {"judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}},
    }
    assert job_from_dict(job).agentrft.judge.model == "m"
    job["method"]["reinforcement"]["grader"] = {
        "type": "multi",
        "graders": {"a": ALL_TYPES["file_f1"]},
        "calculate_output": "a + b",
    }
    with pytest.raises(ConfigError, match=r"method\.reinforcement.*unknown name\(s\) b"):
        job_from_dict(job)


def write(tmp_path: Path, name: str, data: object) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(p)


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grader", "validate", write(tmp_path, "g.json", ALL_TYPES["file_f1"])]) == 0
    assert "valid: file_f1 grader 'f'" in capsys.readouterr().out
    assert (
        main(["grader", "validate", write(tmp_path, "p.json", {"grader": ALL_TYPES["multi"]})]) == 0
    )
    assert (
        main(
            [
                "grader",
                "validate",
                write(
                    tmp_path,
                    "bad.json",
                    {
                        "type": "multi",
                        "graders": {"a": ALL_TYPES["file_f1"]},
                        "calculate_output": "a / c",
                    },
                ),
            ]
        )
        == 2
    )
    assert "unknown name(s) c" in capsys.readouterr().err


def test_cli_run_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grader = write(
        tmp_path,
        "g.json",
        {
            "type": "file_f1",
            "name": "files",
            "input": "{{sample.output_text}}",
            "reference": "{{item.files}}",
        },
    )
    item = write(tmp_path, "i.json", {"files": ["src/auth.py", "tests/test_auth.py"]})
    sample = write(tmp_path, "s.json", {"output_text": "src/auth.py\nREADME.md"})
    assert main(["grader", "run", grader, "--sample", sample, "--item", item]) == 0
    out = capsys.readouterr().out
    assert "reward: 0.5" in out and "precision=0.5" in out and "errors: none" in out
    assert (
        main(["grader", "run", grader, "--model-sample", "src/auth.py", "--item", item, "--json"])
        == 0
    )
    resp = json.loads(capsys.readouterr().out)
    assert resp["reward"] == pytest.approx(2 / 3)
    assert resp["sub_rewards"] == {"precision": 1.0, "recall": 0.5}
    assert resp["metadata"]["errors"]["python_grader_runtime_error"] is False


def test_cli_run_reports_error_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grader = write(
        tmp_path,
        "g.json",
        {
            "type": "string_check",
            "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}",
            "operation": "eq",
        },
    )
    plain = write(tmp_path, "s.txt", "just text, not JSON")
    assert main(["grader", "run", grader, "--sample", plain, "--json"]) == 1
    resp = json.loads(capsys.readouterr().out)
    assert resp["reward"] is None
    assert resp["metadata"]["errors"]["invalid_variable_error"] is True


def test_loaded_local_judge_pickles_without_its_model() -> None:
    g = build_grader(ALL_TYPES["score_model"])
    g.judge._policy = object()  # stands in for a loaded model
    clone = pickle.loads(pickle.dumps(g))
    assert clone.judge._policy is None and clone.judge.model == "smollm2-135m-instruct"


def test_sync_grade_inside_an_event_loop_says_to_await() -> None:
    import asyncio

    g = build_grader(ALL_TYPES["endpoint"])

    async def main() -> None:
        with pytest.raises(RuntimeError, match="await agrade"):
            g.grade(sample_from_text("x"), {})

    asyncio.run(main())
