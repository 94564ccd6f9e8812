"""The quickstart trained through MCP on the real 135M model: `job_mcp.yaml` names only an MCP
server (the quickstart's env.py at /mcp); one short step writes the metrics an HTTP run writes,
and the model's calls reach the tool. (That both jobs render the same prompt is checked in
tests/unit/test_mcp_quickstart.py, without the model.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agentrft.job import job_from_dict
from agentrft.train.loop import train

pytestmark = pytest.mark.integration
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def short(name: str):  # type: ignore[no-untyped-def]
    """The example job cut to one step of 2 rows x 2 rollouts, without the evaluation."""
    data = yaml.safe_load((QUICKSTART / name).read_text())
    data.pop("validation_file")
    data["method"]["reinforcement"]["hyperparameters"] = {"batch_size": 2, "n_epochs": 1}
    ext = data["agentrft"]
    ext.update(group_size=2, dtype="fp32")
    ext["sampling"]["max_tokens_per_turn"] = 40  # a tool call and a short answer fit
    ext.setdefault("train", {}).update(max_steps=1)
    return job_from_dict(data, source=name, base_dir=QUICKSTART)


def test_the_mcp_job_trains_a_step_with_the_metrics_of_an_http_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(short("job_mcp.yaml"), run)
    (metrics,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for key in (
        "reward/mean",
        "rollouts/tool_calls/mean",
        "rollouts/tool_calls/p95",
        "rollouts/discarded",
        "groups/zero_signal",
        "time/sampling_s",
        "time/grading_s",
    ):
        assert key in metrics, key
    assert metrics["rollouts/discarded"] == 0
    assert metrics["rollouts/tool_calls/mean"] > 0  # the model called the MCP tool
    rollouts = [json.loads(x) for x in (run / "rollouts/step-1.jsonl").read_text().splitlines()]
    outputs = [m["content"] for r in rollouts for m in r["messages"] if m["role"] == "tool"]
    assert outputs and all("capital:" in o or "unknown country" in o for o in outputs[-4:])
    assert (run / "checkpoints/latest").read_text() == "step-1"
