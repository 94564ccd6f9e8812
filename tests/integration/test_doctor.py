"""`agentrft doctor` and the hack watch on the real 135M model: the doctor runs on the
quickstart and fails the deliberately hackable job's hackability check with the probes named;
a training run logs the watch in metrics.jsonl and writes readings the report links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.cli.main import main
from agentrft.train.loop import train
from tests.integration.test_train import make_job

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_doctor_on_the_quickstart_writes_four_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "doctor"
    rc = main(
        [
            "doctor",
            str(ROOT / "examples/quickstart/job.yaml"),
            "--rows",
            "3",
            "-k",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rep = json.loads((out / "doctor.json").read_text())
    assert [c["rule"] for c in rep["checks"]] == [
        "unambiguous success",
        "data mirrors production",
        "best-of-k rises",
        "reward is not hackable",
    ]
    assert rep["checks"][1]["status"] == "skip"  # no traffic given: says how to collect it
    assert "--request-log" in rep["checks"][1]["fix"][0]
    assert rep["checks"][0]["data"]["graded_twice"] == 6
    assert set(rep["checks"][3]["data"]["probes"]) >= {"empty", "tool_output", "refusal"}
    assert "reward is not hackable" in (out / "doctor.html").read_text()


def test_the_hackable_job_fails_hackability_with_the_probe_named(tmp_path: Path) -> None:
    out = tmp_path / "doctor"
    job = str(ROOT / "examples/hackable/job.yaml")
    rc = main(["doctor", job, "--rows", "4", "-k", "2", "--strict", "--out", str(out)])
    assert rc == 1  # --strict: a failed check is a failed command
    hack = json.loads((out / "doctor.json").read_text())["checks"][3]
    assert hack["status"] == "fail"
    # listing every file the tool returned earns plain F1 partial credit on each row
    assert {"tool_output", "every_candidate"} <= set(hack["data"]["failed"])
    assert hack["data"]["probes"]["every_candidate"]["mean"] > 0.3
    assert any(line.startswith("every_candidate ") for line in hack["fix"])


def test_training_logs_the_hack_watch_and_saves_readings(tmp_path: Path) -> None:
    from agentrft.job import load_job

    run = train(load_job(make_job(tmp_path, steps=2)), tmp_path / "run")
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    watched = [r for r in rows if "hack_watch/flags" in r]
    assert [r["step"] for r in watched] == [1, 2]
    assert all(r["hack_watch/flags"] == 0 for r in watched)  # two steps: shorter than the window
    assert sorted(p.name for p in (run / "readings").iterdir()) == ["step-1.html", "step-2.html"]
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert 'href="readings/step-2.html"' in page
