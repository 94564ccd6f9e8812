"""What a run writes as it goes: `metrics.jsonl` (one line per step, flat keys), TensorBoard
events, and the rollouts of every step under `rollouts/step-N.jsonl`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrft.rollout.records import finite, write_jsonl


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested numeric dicts -> {"a/b": value}. Non-numeric leaves are dropped."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, int | float):  # bools included
            out[key] = float(v)
    return out


class RunLog:
    def __init__(self, run_dir: Path, resume_from_step: int | None = None) -> None:
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        if resume_from_step is not None and self.metrics_path.exists():
            # drop lines written after the checkpoint we resume from: they will be redone
            kept = [
                ln
                for ln in self.metrics_path.read_text().splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) <= resume_from_step
            ]
            self.metrics_path.write_text("".join(ln + "\n" for ln in kept))
        from tensorboardX import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(
        self, step: int, metrics: Mapping[str, Any], tags: Mapping[str, str] | None = None
    ) -> None:
        """One line of metrics.jsonl; `tags` are text fields kept beside the numbers (the
        engine and the adapter it sampled with), not sent to TensorBoard."""
        flat = flatten(metrics)
        line = {"step": step, **(tags or {}), **flat}
        write_jsonl(self.metrics_path, [finite(line)], append=True)
        for k, v in flat.items():
            if math.isfinite(v):
                self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def rollouts(self, name: str, records: list[dict[str, Any]]) -> None:
        write_jsonl(self.run_dir / "rollouts" / f"{name}.jsonl", records)

    def close(self) -> None:
        self.tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return (
        [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        if path.exists()
        else []
    )
