"""A job evaluated with the model behind an OpenAI-compatible endpoint: our own serve-model
app on loopback, the real 135M model, as `agentrft eval JOB --model http://.../v1` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrft.serve.app import create_app
from agentrft.tools.envkit import serve_in_thread


def evaluate_through_endpoint(
    policy: Any, job: Any, items: list[Any], k: int, out: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The eval's result and its rollout records."""
    from agentrft.evaluate.measure import evaluate_model

    with serve_in_thread(create_app(policy, "smollm2-135m-instruct")) as url:
        res = evaluate_model(job, items, k, f"{url}/v1", out, label="endpoint")
    records = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return res, records
