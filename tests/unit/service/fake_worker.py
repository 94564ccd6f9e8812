"""A stand-in for `agentrft.service.worker` in the unit tests: it writes what a training
run writes (hyperparameters.json, metrics.jsonl, rollouts, checkpoints) without a model.

The job's `metadata` steers it: `fake_steps` (default 2), `fake_step_s` (seconds per step,
default 0), `fake_fail` (an error message: the run fails with it), `fake_list_tools` (the
job's tools are built as a run builds them, MCP servers listed, and their names written to
RUN_DIR/tools.json). It loads its job as the real worker does (job.json plus the secrets on
stdin) and writes the sha256 of each tool header value and tool URL it got to
`fake_worker_secrets.json`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from agentrft.service.worker import die_with_parent_server, load_run_job, write_result


def main() -> int:
    import os

    run_dir = Path(sys.argv[1])
    die_with_parent_server(int(os.environ["AGENTRFT_SERVICE_PID"]))
    job = load_run_job(run_dir).model_dump(mode="json")  # the real worker's way in
    # what it got of the secrets, as hashes only: the test checks them, nothing leaks
    seen = [v for t in job["method"]["reinforcement"]["tools"] for v in t["headers"].values()]
    seen += [t["server_url"] for t in job["method"]["reinforcement"]["tools"]]
    (run_dir / "fake_worker_secrets.json").write_text(
        json.dumps(sorted(hashlib.sha256(v.encode()).hexdigest() for v in seen))
    )
    meta = job.get("metadata") or {}
    steps, step_s = int(meta.get("fake_steps", 2)), float(meta.get("fake_step_s", 0))
    if meta.get("fake_list_tools"):
        from agentrft.job import job_from_dict
        from agentrft.runtime import tools_from_job

        tools = tools_from_job(job_from_dict(job, base_dir=run_dir))
        (run_dir / "tools.json").write_text(json.dumps(sorted(tools)))
    if meta.get("fake_fail"):
        write_result(run_dir, {"error": {"code": "training_aborted", "message": meta["fake_fail"]}})
        return 1
    (run_dir / "hyperparameters.json").write_text(
        json.dumps({"batch_size": 2, "n_epochs": 1, "total_steps": steps})
    )
    latest = run_dir / "checkpoints" / "latest"
    start = int(latest.read_text().removeprefix("step-")) if latest.is_file() else 0
    for step in range(start + 1, steps + 1):
        time.sleep(step_s)
        row = {
            "step": step,
            "reward/mean": 0.1 * step,
            "reward/n": 16,
            "eval/reward/mean": 0.05 * step,
            "rollouts/tool_calls/mean": 1.0,
            "rollouts/tool_calls_histogram/1": 3.0,
            "rollouts/stop_reasons/final_answer": 4.0,
        }
        with (run_dir / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        rollouts = run_dir / "rollouts"
        rollouts.mkdir(exist_ok=True)
        record = {
            "trace_id": f"trace-{step}",
            "row": 0,
            "reward": 0.5,
            "stop_reason": "final_answer",
            "num_tool_calls": 1,
            "messages": [
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris"},
            ],
            "turns": [{"tool_results": []}],
        }
        (rollouts / f"step-{step}.jsonl").write_text(json.dumps(record) + "\n")
        ckpt = run_dir / "checkpoints" / f"step-{step}" / "adapter"
        ckpt.mkdir(parents=True, exist_ok=True)
        latest.write_text(f"step-{step}")
    write_result(run_dir, {"status": "succeeded"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
