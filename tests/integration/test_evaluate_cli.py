"""eval, preflight, compare, sample and report on the real 135M model, with the quickstart
job's tool server running as a real loopback HTTP server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.cli import main

pytestmark = pytest.mark.integration
JOB = str(Path(__file__).resolve().parents[2] / "examples/quickstart/job.yaml")


def test_eval_preflight_compare_sample_report(tmp_path, capsys):
    base, again = tmp_path / "base", tmp_path / "again"
    assert main(["eval", JOB, "-k", "2", "--rows", "2", "--out", str(base)]) == 0
    res = json.loads((base / "results.json").read_text())
    assert res["rollouts"] == 4 and res["k"] == 2
    assert (
        0.0 <= res["reward"]["mean"] <= 1.0
        and res["reward"]["n"] + res["discarded"] + sum(res["grader_errors"].values()) == 4
    )
    assert res["tool_calls_per_tool"].get("lookup_country", 0) >= 1  # the HTTP tool really ran
    for key in (
        "pass_rate",
        "tool_calls",
        "tool_calls_histogram",
        "sampled_tokens",
        "latency_s",
        "stop_reasons",
        "discard_rate",
        "tool_request_bytes",
    ):
        assert key in res, key
    recs = [json.loads(x) for x in (base / "rollouts.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(r["grade"] is not None for r in recs)

    assert (
        main(["eval", JOB, "-k", "2", "--rows", "2", "--temperature", "0", "--out", str(again)])
        == 0
    )
    assert main(["compare", str(base), str(again), "--out", str(tmp_path / "cmp.html")]) == 0
    out = capsys.readouterr().out
    assert "reward mean" in out and "tool calls p95" in out and "B - A" in out
    html = (tmp_path / "cmp.html").read_text()
    assert html.count("data:image/png;base64,") >= 1

    pf = tmp_path / "pf"
    assert main(["preflight", JOB, "-k", "3", "--rows", "2", "--out", str(pf)]) == 0
    rep = json.loads((pf / "preflight.json").read_text())
    assert rep["verdict"] in {"learnable", "weak_signal", "no_reward", "saturated", "broken"}
    assert set(rep["best_of_k"]) == {"1", "2"} and rep["samples_per_row"] == 3
    assert rep["best_of_k"]["2"] >= rep["best_of_k"]["1"] - 1e-9  # best-of-k never falls with k
    assert "verdict:" in capsys.readouterr().out

    sm = tmp_path / "sm"
    assert main(["sample", JOB, "--best-of", "2", "--rows", "2", "--out", str(sm)]) == 0
    best = [json.loads(x) for x in (sm / "best.jsonl").read_text().splitlines()]
    graded = [json.loads(x) for x in (sm / "rollouts.jsonl").read_text().splitlines()]
    for b in best:
        row_rewards = [
            r["reward"] for r in graded if r["row"] == b["row"] and r["reward"] is not None
        ]
        assert b["reward"] == max(row_rewards)

    assert main(["report", str(base), "--out", str(tmp_path / "r.html")]) == 0
    assert "trajectories" in (tmp_path / "r.html").read_text()


def test_eval_rejects_an_unknown_model_clearly(tmp_path, capsys):
    assert (
        main(
            [
                "eval",
                JOB,
                "--rows",
                "1",
                "--model",
                str(tmp_path / "nope"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "not found" in capsys.readouterr().err
