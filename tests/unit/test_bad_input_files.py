"""Bad input files end in one line that names the file (and the line) and the fix, never in
a traceback (that needs -v): non-UTF-8 job, dataset and grader files, a missing --sample
file, a missing --resume directory, a formula nested 200 levels deep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.cli import main

LATIN1 = "caf\xe9".encode("latin-1")  # 0xe9 alone is not UTF-8
GRADER = {
    "type": "string_check",
    "name": "s",
    "input": "{{sample.output_text}}",
    "reference": "x",
    "operation": "eq",
}


def job(training_file: str = "train.jsonl") -> dict:
    return {
        "training_file": training_file,
        "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
    }


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert "Traceback" not in err
    assert "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_non_utf8_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"training_file: train.jsonl\nsuffix: " + LATIN1 + b"\n")
    one_line_error(
        ["train", str(path), "--out", str(tmp_path / "run")], capsys, f"{path}:2:", "UTF-8"
    )


def test_non_utf8_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.json").write_text(json.dumps(job()))
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    (tmp_path / "train.jsonl").write_bytes(good + b"\n" + good.replace(b"hi", LATIN1) + b"\n")
    one_line_error(
        ["train", str(tmp_path / "job.json"), "--out", str(tmp_path / "run")],
        capsys,
        f"{tmp_path / 'train.jsonl'}:2:",
        "UTF-8",
    )


def test_non_utf8_grader_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "grader.json"
    path.write_bytes(json.dumps(GRADER).encode().replace(b'"x"', b'"' + LATIN1 + b'"'))
    one_line_error(["grader", "validate", str(path)], capsys, f"{path}:1:", "UTF-8")


def test_missing_sample_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "grader.json").write_text(json.dumps(GRADER))
    missing = tmp_path / "sample.json"
    one_line_error(
        ["grader", "run", str(tmp_path / "grader.json"), "--sample", str(missing)],
        capsys,
        str(missing),
        "not found",
    )


def test_missing_resume_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "runs" / "train-nope"
    one_line_error(["train", "--resume", str(missing)], capsys, str(missing), "--resume")


def test_formula_nested_200_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "grader.json"
    formula = "(" * 200 + "s" + ")" * 200
    path.write_text(
        json.dumps({"type": "multi", "graders": {"s": GRADER}, "calculate_output": formula})
    )
    one_line_error(["grader", "validate", str(path)], capsys, str(path), "nested more than")


def test_unexpected_errors_are_one_line_without_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrft.cli import graders as commands

    def boom(args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(commands, "cmd_validate", boom)
    (tmp_path / "grader.json").write_text(json.dumps(GRADER))
    one_line_error(["grader", "validate", str(tmp_path / "grader.json")], capsys, "KeyError", "-v")
