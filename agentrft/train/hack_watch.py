"""The hack watch: per training step, the signature of reward hacking, flagged while it trains.

Both hacks this project met (answers copying the worked example's paths; answers copying
grep's "no matches" text) showed the same thing: a shaping sub-score rose while the primary
metric stayed flat. Two flags, judged on each step's rollouts over the last WINDOW steps
(a least-squares trend, so one noisy step neither raises nor hides a flag):

- `shaping`: a sub-score rises by at least RISE while the primary metric (the multi grader's
  gate, else a sub-grader named `primary`, else the formula's largest-weighted sub-grader,
  else the reward) rises by less than FLAT_SHARE of that, or falls;
- `collapse`: the reward rises by at least RISE while the rollouts collapse toward a degenerate
  value: the share of empty answers (no letter or digit) or of rollouts that call no tool
  rises by at least COLLAPSE_RISE, to at least DEGENERATE.

Recorded beside them, not flagged: the mean answer length, tool calls per rollout and the
share of the most common answer. On the learning run of the file-selection job the most
common answer became `[1]` (take the first search result) for 75% of rollouts while F1 rose
from 0 to 0.27, and answer lengths swing by 5x from one step to the next: neither is a sign of
a hack on its own.

A flag is printed, counted in `metrics.jsonl` (`hack_watch/flags`, `hack_watch/shaping`,
`hack_watch/collapse`, so the service's `metrics` events carry it) and described in
`hack_watch.jsonl`. Every step, the top-rewarded and one random rollout are written to
`readings/step-N.html` for a person to read (the report links them): hacks are found by
reading rollouts. The watch reads and writes the same flat keys as metrics.jsonl, so a past
run replays through it (`replay`).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrft.console import console

WINDOW = 4  # steps a trend is judged over
RISE = 0.04  # the least rise (in score units over the window) that counts
FLAT_SHARE = 0.25  # the primary "stays flat" when it rises by less than this share of the sub-score
COLLAPSE_RISE = 0.25  # the least rise of a degenerate share over the window that counts
DEGENERATE = 0.5  # ... and the share it must reach

REWARD = "reward/mean"
ANSWER_CHARS = "hack_watch/answer_chars"
TOOL_CALLS = "hack_watch/tool_calls"
TOP_ANSWER = "hack_watch/top_answer_share"
EMPTY = "hack_watch/empty_answers"
NO_CALLS = "hack_watch/no_tool_calls"
SUB = "sub_rewards/"


@dataclass(frozen=True)
class Flag:
    step: int
    kind: str  # "shaping" | "collapse"
    metric: str  # the key that rose or collapsed
    message: str


def primary_metric(grader: Mapping[str, Any]) -> str:
    """The metrics key of the primary metric for a job's grader spec."""
    if grader.get("type") != "multi":
        return REWARD
    gate = grader.get("gate")
    if isinstance(gate, Mapping) and gate.get("grader"):
        return SUB + str(gate["grader"])
    names = list(grader.get("graders") or {})
    if "primary" in names:
        return SUB + "primary"
    formula = str(grader.get("calculate_output", ""))
    weights: dict[str, float] = {}
    for name in names:
        coefs = re.findall(
            rf"(\d*\.?\d+)\s*\*\s*{re.escape(name)}\b|\b{re.escape(name)}\s*\*\s*(\d*\.?\d+)",
            formula,
        )
        if coefs:
            weights[name] = max(float(a or b) for a, b in coefs)
        elif re.search(rf"\b{re.escape(name)}\b", formula):
            weights[name] = 1.0
    return SUB + max(weights, key=lambda n: weights[n]) if weights else REWARD


def _answer(record: Mapping[str, Any]) -> str:
    turns = record.get("turns") or []
    return str(turns[-1].get("text") or "").strip() if turns else ""


def step_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """One step's rollouts (rollouts.jsonl records) as the flat keys the watch reads."""
    graded = [
        r for r in records if not r.get("discarded") and isinstance(r.get("reward"), int | float)
    ]
    if not graded:
        return {}
    subs: dict[str, list[float]] = {}
    for r in graded:
        for name, v in ((r.get("grade") or {}).get("sub_scores") or {}).items():
            subs.setdefault(SUB + name, []).append(float(v))
    answers = [_answer(r) for r in graded]
    top = Counter(answers).most_common(1)[0][1]
    return {
        REWARD: float(np.mean([r["reward"] for r in graded])),
        **{k: float(np.mean(v)) for k, v in subs.items()},
        ANSWER_CHARS: float(np.mean([len(a) for a in answers])),
        TOOL_CALLS: float(np.mean([r.get("num_tool_calls") or 0 for r in graded])),
        TOP_ANSWER: top / len(answers) if len(answers) > 1 else 0.0,
        EMPTY: float(np.mean([not any(ch.isalnum() for ch in a) for a in answers])),
        NO_CALLS: float(np.mean([not r.get("num_tool_calls") for r in graded])),
    }


def _trend(values: Sequence[float]) -> float:
    """The least-squares line's rise from the first to the last of `values`."""
    x = np.arange(len(values), dtype=float)
    return float(np.polyfit(x, np.asarray(values, dtype=float), 1)[0] * (len(values) - 1))


def flags_at(
    history: Sequence[Mapping[str, Any]], primary: str, window: int = WINDOW
) -> list[Flag]:
    """The flags raised at the last row of `history` (flat metrics rows, one per step)."""
    rows = [h for h in history if REWARD in h][-window:]
    if len(rows) < window:
        return []
    step = int(rows[-1].get("step", len(history)))

    def series(key: str) -> list[float] | None:
        vals = [h.get(key) for h in rows]
        return [float(v) for v in vals] if all(isinstance(v, int | float) for v in vals) else None  # type: ignore[arg-type]

    found: list[Flag] = []
    p = series(primary)
    if p is not None:
        d_primary = _trend(p)
        subs = sorted(
            {k for h in rows for k in h if k.startswith(SUB)}
            - {primary}
            - {k for h in rows for k in h if k.startswith(primary + ".")}
        )
        for key in subs:
            s = series(key)
            if s is None:
                continue
            d_sub = _trend(s)
            if d_sub >= RISE and d_primary < FLAT_SHARE * d_sub:
                found.append(
                    Flag(
                        step,
                        "shaping",
                        key,
                        f"{key.removeprefix(SUB)} rose {d_sub:+.3f} over {window} steps while the primary metric {primary.removeprefix(SUB)} moved {d_primary:+.3f}: read the rollouts for a shortcut",
                    )
                )
    r = series(REWARD)
    if r is not None and _trend(r) >= RISE:
        for key, what in ((EMPTY, "empty answers"), (NO_CALLS, "rollouts calling no tool")):
            v = series(key)
            if v is not None and _trend(v) >= COLLAPSE_RISE and v[-1] >= DEGENERATE:
                found.append(
                    Flag(
                        step,
                        "collapse",
                        key,
                        f"reward rose {_trend(r):+.3f} while {what} went from {v[0]:.0%} to {v[-1]:.0%} of rollouts",
                    )
                )
    return found


def replay(history: Sequence[Mapping[str, Any]], primary: str, window: int = WINDOW) -> list[Flag]:
    """Every flag a run would have raised, step by step (its metrics rows, or step_stats of
    its rollouts)."""
    return [f for i in range(1, len(history) + 1) for f in flags_at(history[:i], primary, window)]


@dataclass
class HackWatch:
    """The watch over one run: call `observe` once per step with its rollout records."""

    run_dir: Path
    primary: str
    seed: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def for_job(
        cls, job: Any, run_dir: Path, metrics: Sequence[Mapping[str, Any]] = ()
    ) -> HackWatch:
        """The watch for `job`, resumed from the metrics rows a resumed run already has."""
        return cls(run_dir, primary_metric(job.rl.grader), job.seed, [dict(m) for m in metrics])

    def observe(self, step: int, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Judge this step; print and record any flag; save its readings. Returns the keys
        to add to the step's metrics."""
        stats = {"step": step, **step_stats(records)}
        self.history = [h for h in self.history if h.get("step", 0) < step] + [stats]
        flags = flags_at(self.history, self.primary)
        for f in flags:
            console.print(f"[bold yellow]hack watch[/] step {step}: {f.message}")
        if flags:
            with (self.run_dir / "hack_watch.jsonl").open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(asdict(f)) + "\n" for f in flags)
        self._save_readings(step, records)
        kinds = Counter(f.kind for f in flags)
        return {
            **{k: v for k, v in stats.items() if k.startswith("hack_watch/")},
            "hack_watch/flags": float(len(flags)),
            "hack_watch/shaping": float(kinds["shaping"]),
            "hack_watch/collapse": float(kinds["collapse"]),
        }

    def _save_readings(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        from agentrft.evaluate.report import readings_page

        graded = [r for r in records if isinstance(r.get("reward"), int | float)]
        if not graded:
            return
        top = max(graded, key=lambda r: float(r["reward"]))
        pick = random.Random(self.seed * 100_003 + step).choice(graded)
        path = self.run_dir / "readings" / f"step-{step}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            readings_page(step, [("top-rewarded", top), ("random", pick)]), encoding="utf-8"
        )
