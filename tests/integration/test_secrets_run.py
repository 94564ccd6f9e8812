"""A successful one-step training run on the real 135M model whose tools and grader carry
secrets in headers and URLs: the secrets reach the servers, and nothing under the run
directory holds them; the directory is 0700 and its files 0600."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrft.cli import main
from agentrft.tools.envkit import ToolServer, serve_in_thread
from tests.unit.test_secrets import assert_clean, secret_job

pytestmark = pytest.mark.integration


def test_a_successful_run_leaves_no_secret_on_disk(tmp_path: Path) -> None:
    env = ToolServer("secret-env")
    seen: list[dict[str, str]] = []

    @env.tool(description="Look a word up", parameters={"type": "object", "properties": {}})
    def lookup(ctx: Any) -> str:
        seen.append(ctx.headers)
        return "apple"

    @env.grader
    def grade(ctx: Any, sample: dict[str, Any], item: dict[str, Any]) -> float:
        seen.append(ctx.headers)
        return float("apple" in sample.get("output_text", ""))

    rows = [
        {"messages": [{"role": "user", "content": "Say the word apple."}], "answer": "apple"}
    ] * 2
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with serve_in_thread(env.app) as url:
        job = secret_job(tmp_path, url)
        job["seed"] = 3
        job["method"]["reinforcement"]["hyperparameters"] = {"batch_size": 1, "n_epochs": 1}
        del job["agentrft"]["environment"]  # the tool server runs here
        job["agentrft"].update(
            {
                "group_size": 2,
                "dtype": "fp32",
                "prefill": '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>',
                "sampling": {"max_tokens_per_turn": 4, "max_tokens_per_episode": 8},
                "train": {"max_steps": 1, "checkpoint_interval": 1},
            }
        )
        (tmp_path / "job.json").write_text(json.dumps(job))
        run_dir = tmp_path / "run"
        assert main(["train", str(tmp_path / "job.json"), "--out", str(run_dir)]) == 0
    assert any(h.get("x-api-key") == "grader-secret-4" for h in seen)  # the secrets were used ...
    assert (run_dir / "metrics.jsonl").is_file()
    assert_clean(run_dir)  # ... and not written
