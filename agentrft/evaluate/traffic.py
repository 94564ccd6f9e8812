"""Does the training data mirror production? Served traffic (a `serve-model --request-log`
file) against the job's training rows.

Three comparisons:
- request length: characters of the last user message, training rows against served requests
  (medians, p95 and the two-sample Kolmogorov-Smirnov test);
- tool calls: per base rollout of the training rows against per served conversation (the
  assistant tool calls in its history plus the reply's), as shares and total variation distance;
- distance: each served request's nearest training row by cosine similarity of sentence
  embeddings (the all-MiniLM-L6-v2 model the `text_similarity` grader ships), and the share
  of requests whose nearest row is far (similarity below FAR).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrft.errors import ConfigError
from agentrft.types import Item, Trajectory

FAR = 0.5  # nearest training row below this cosine similarity: the request is unlike the data
MAX_ROWS = 2000  # training rows embedded at most (the first ones), to stay fast on a laptop

HOW_TO_COLLECT = (
    "Log served traffic and pass it in: `agentrft serve-model RUN_DIR --request-log requests.jsonl` "
    "(opt-in, secrets redacted), then `agentrft doctor JOB.yaml --traffic requests.jsonl`."
)


def load_traffic(path: str | Path) -> list[dict[str, Any]]:
    """The logged requests in a JSONL file, or in every *.jsonl file of a folder."""
    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    if not p.exists() or not files:
        raise ConfigError(f"{path}: no request log here; {HOW_TO_COLLECT}")
    out: list[dict[str, Any]] = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{f}:{n}: not JSON ({exc.msg}); the request log is JSONL"
                ) from None
            if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
                raise ConfigError(
                    f'{f}:{n}: a logged request needs "messages" (a list), as `serve-model --request-log` writes'
                )
            out.append(rec)
    return out


def request_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request a conversation asks: its last user message's text."""
    for m in reversed(messages):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            return str(content or "")
    return ""


def served_tool_calls(rec: Mapping[str, Any]) -> int:
    """Tool calls of one served request: those in its history plus its reply's."""
    history = sum(
        len(m.get("tool_calls") or []) for m in rec["messages"] if m.get("role") == "assistant"
    )
    return history + int((rec.get("response") or {}).get("tool_calls") or 0)


def _conversations(traffic: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One request per conversation: the longest one with the same first user message (an
    agent's turns are separate requests that repeat the history)."""
    last: dict[str, Mapping[str, Any]] = {}
    for rec in traffic:
        first = next(
            (str(m.get("content")) for m in rec["messages"] if m.get("role") == "user"), ""
        )
        if first not in last or len(rec["messages"]) >= len(last[first]["messages"]):
            last[first] = rec
    return list(last.values())


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95))}


def _shares(values: Sequence[int]) -> dict[int, float]:
    counts = Counter(values)
    return {k: counts[k] / len(values) for k in sorted(counts)}


def compare_traffic(
    items: Sequence[Item], rollouts: Sequence[Trajectory], traffic: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Training rows (and the base model's rollouts of them) against served requests."""
    from scipy import stats

    from agentrft.graders.text_similarity import embed

    rows = list(items[:MAX_ROWS])
    train_text = [request_text(it.messages) for it in rows]
    served = [rec for rec in traffic if request_text(rec["messages"])]
    served_text = [request_text(rec["messages"]) for rec in served]
    if not served or not train_text:
        return {"requests": len(traffic), "usable": len(served)}
    len_train = [len(t) for t in train_text]
    len_served = [len(t) for t in served_text]
    ks = stats.ks_2samp(len_train, len_served)
    calls_train = [len(t.tool_calls) for t in rollouts if t.discarded is None]
    calls_served = [served_tool_calls(rec) for rec in _conversations(served)]
    tv = math.nan
    if calls_train and calls_served:
        a, b = _shares(calls_train), _shares(calls_served)
        tv = 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
    sim = embed(served_text) @ embed(train_text).T  # both unit length: cosine similarity
    nearest = sim.max(axis=1)
    far = nearest < FAR
    worst = np.argsort(nearest)[:3]
    return {
        "requests": len(traffic),
        "usable": len(served),
        "training_rows": len(rows),
        "request_chars": {
            "train": _quantiles(len_train),
            "served": _quantiles(len_served),
            "ks_statistic": float(ks.statistic),
            "ks_p_value": float(ks.pvalue),
        },
        "tool_calls": {
            "train_rollouts": _shares(calls_train) if calls_train else {},
            "served_conversations": _shares(calls_served),
            "total_variation": tv,
        },
        "nearest_similarity": _quantiles(nearest.tolist()),
        "far_share": float(far.mean()),
        "far_threshold": FAR,
        "farthest": [
            {"request": served_text[i][:200], "similarity": float(nearest[i])} for i in worst
        ],
    }
