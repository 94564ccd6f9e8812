"""Rollouts as readable JSON records (`rollouts.jsonl`) and as summary statistics, and the
output folder each command writes them to."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrft.data import jsonl
from agentrft.types import Grade, Origin, Trajectory


def token_counts(traj: Trajectory) -> dict[str, int]:
    counts = Counter(traj.origins)
    out = {o.name.lower(): counts.get(int(o), 0) for o in Origin}
    out["total"] = len(traj.tokens)
    out["sampled"] = traj.sampled_tokens  # SAMPLED + FORCED when tokens are recorded
    return out


def to_record(
    traj: Trajectory, grade: Grade | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One trajectory as a JSON-ready dict: what a person reads to see what happened."""
    return {
        "trace_id": traj.trace_id,
        "row": traj.item.index,
        "source": traj.item.source,
        "stop_reason": traj.stop_reason.value,
        "discarded": traj.discarded,
        "reward": None if grade is None or grade.error else grade.score,
        "grade": None
        if grade is None
        else {
            "score": None if grade.error else grade.score,
            "sub_scores": dict(grade.sub_scores),
            "error": grade.error,
            "metrics": dict(grade.metrics),
        },
        "num_tool_calls": len(traj.tool_calls),
        "num_turns": len(traj.turns),
        "tokens": token_counts(traj),
        "timings": {k: round(v, 4) for k, v in traj.timings.items()},
        "turns": [
            {
                "index": t.index,
                "text": t.text,
                "sampled_tokens": t.sampled_tokens,
                "sample_s": round(t.sample_s, 4),
                "tools_s": round(t.tools_s, 4),
                "tool_calls": [
                    {
                        "call_id": c.call_id,
                        "name": c.name,
                        "arguments": c.arguments,
                        "error": c.error,
                    }
                    for c in t.tool_calls
                ],
                "tool_results": [
                    {
                        "call_id": r.call_id,
                        "name": r.name,
                        "status": r.status,
                        "latency_s": round(r.latency_s, 4),
                        "attempts": r.attempts,
                        "output": r.output,
                    }
                    for r in t.tool_results
                ],
            }
            for t in traj.turns
        ],
        "messages": [dict(m) for m in traj.messages],
        "item": dict(traj.item.fields),
        **(extra or {}),
    }


def finite(obj: Any) -> Any:
    """JSON has no NaN/Infinity: write them as null (a missing value), recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def new_output_dir(out: str | Path | None, kind: str, base: str | Path = "runs") -> Path:
    """The folder a command writes to, created mode 0700: `out` when given, else
    `base/KIND-TIMESTAMP`."""
    path = Path(out) if out else Path(base) / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)  # a run's files (its job, rollouts, checkpoints) are its owner's only
    return path


def write_jsonl(path: Path, records: Iterable[dict[str, Any]], append: bool = False) -> int:
    """Records as JSONL (agentrft.data.jsonl's writer), non-finite numbers as null."""
    return jsonl.write_jsonl(path, (finite(rec) for rec in records), append=append)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def distribution(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    arr = np.asarray(values, dtype=float)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
    }


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Tool use, tokens, latency and stop reasons over a set of rollouts."""
    kept = [t for t in trajs if t.discarded is None]
    per_tool: Counter[str] = Counter(c.name or "(invalid)" for t in kept for c in t.tool_calls)
    results = [r for t in kept for r in t.tool_results]
    return {
        "rollouts": len(trajs),
        "discarded": len(trajs) - len(kept),
        "discard_reasons": dict(Counter((t.discarded or "")[:120] for t in trajs if t.discarded)),
        "stop_reasons": dict(Counter(t.stop_reason.value for t in trajs)),
        "tool_calls": distribution([len(t.tool_calls) for t in kept]),
        "tool_calls_histogram": dict(sorted(Counter(len(t.tool_calls) for t in kept).items())),
        "tool_calls_per_tool": dict(per_tool),
        "invalid_tool_calls": sum(1 for t in kept for c in t.tool_calls if c.error),
        "tool_errors": sum(1 for r in results if r.status != "ok"),
        "tool_latency_s": distribution(
            [r.latency_s for r in results if r.status != "invalid_call"]
        ),
        "turns": distribution([len(t.turns) for t in kept]),
        "sampled_tokens": distribution([t.sampled_tokens for t in kept]),
        "tokens_per_tool_call": float(
            np.mean([t.sampled_tokens / len(t.tool_calls) for t in kept if t.tool_calls])
        )
        if any(t.tool_calls for t in kept)
        else 0.0,
        "tool_request_bytes": int(sum(r.request_bytes for r in results)),
        "latency_s": distribution([t.timings.get("total_s", 0.0) for t in kept]),
    }
