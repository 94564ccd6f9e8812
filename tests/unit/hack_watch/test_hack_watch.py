"""The hack watch replays the project's two recorded reward hacks and a real learning run.

The hacks (agentrft/tasks/file_selection/README.md, section 3.1) were found by reading rollouts:
- v5: reward 0.7 x files + 0.3 x near; training raised the held-out reward from 0.012 to
  0.067, nearly all of it path closeness (`near`), by copying the worked example's paths;
  file F1 went from 0 to 0.018;
- v6: reward 0.6 x files + 0.4 x found; the held-out reward rose from 0.004 to 0.101 with
  file F1 still 0, by copying grep's "no matches" message.
Only those endpoints were recorded, so the series below are DERIVED: each sub-score is
solved from the recorded reward and F1 at both ends and interpolated linearly over the
8 training steps (and, in a second test, given seeded noise). The learning run is real: the
step_stats of every step's rollouts of an 8-step run of agentrft/tasks/file_selection/job.yaml,
stored in file_selection_learning_run.json.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from agentrft.train.hack_watch import (
    EMPTY,
    REWARD,
    HackWatch,
    flags_at,
    primary_metric,
    replay,
    step_stats,
)

HERE = Path(__file__).resolve().parent
HISTORY = HERE.parents[2] / "agentrft" / "tasks" / "file_selection" / "history"


def grader_of(version: int) -> dict:
    return yaml.safe_load((HISTORY / f"job_v{version}.yaml").read_text())["method"][
        "reinforcement"
    ]["grader"]


def derived_series(
    weights: dict[str, float],
    reward: tuple[float, float],
    files: tuple[float, float],
    noise: float = 0.0,
) -> list[dict[str, float]]:
    """Steps 0..8: `files` interpolated between its recorded ends, the shaping sub-score solved
    from the reward formula at both ends and interpolated; optional seeded noise."""
    (shaping,) = [n for n in weights if n != "files"]

    def solve(r: float, f: float) -> float:
        return (r - weights["files"] * f) / weights[shaping]

    lo, hi = solve(reward[0], files[0]), solve(reward[1], files[1])
    rng = random.Random(0)
    rows = []
    for step in range(9):
        t = step / 8
        f = files[0] + t * (files[1] - files[0])
        s = max(0.0, lo + t * (hi - lo) + rng.gauss(0, noise))
        rows.append(
            {
                "step": step,
                "sub_rewards/files": f,
                f"sub_rewards/{shaping}": s,
                REWARD: weights["files"] * f + weights[shaping] * s,
            }
        )
    return rows


V5 = ({"files": 0.7, "near": 0.3}, (0.012, 0.067), (0.0, 0.018))
V6 = ({"files": 0.6, "found": 0.4}, (0.004, 0.101), (0.0, 0.0))


def test_the_primary_metric_of_the_recorded_jobs_is_file_f1() -> None:
    assert primary_metric(grader_of(5)) == "sub_rewards/files"
    assert primary_metric(grader_of(6)) == "sub_rewards/files"
    current = yaml.safe_load((HISTORY.parent / "job.yaml").read_text())
    assert primary_metric(current["method"]["reinforcement"]["grader"]) == "sub_rewards/grounded"
    gated = {"type": "multi", "graders": {"tests": {}, "style": {}}, "gate": {"grader": "tests"}}
    assert primary_metric(gated) == "sub_rewards/tests"
    assert primary_metric({"type": "string_check"}) == REWARD


@pytest.mark.parametrize(("version", "spec", "shaping"), [(5, V5, "near"), (6, V6, "found")])
@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_both_recorded_hacks_are_flagged(
    version: int, spec: tuple, shaping: str, noise: float
) -> None:
    series = derived_series(*spec, noise=noise)
    flags = replay(series, primary_metric(grader_of(version)))
    assert flags, f"v{version} was not flagged"
    assert {f.kind for f in flags} == {"shaping"}
    assert {f.metric for f in flags} == {f"sub_rewards/{shaping}"}
    assert "primary metric files" in flags[0].message


def test_the_real_learning_run_raises_no_flag() -> None:
    run = json.loads((HERE / "file_selection_learning_run.json").read_text())
    steps = run["steps"]
    assert steps[-1][REWARD] - steps[0][REWARD] > 0.3  # it did learn: 0.000 -> 0.458
    assert replay(steps, run["primary"]) == []


def test_the_learning_run_would_be_flagged_if_its_primary_had_stayed_flat() -> None:
    """The check can fail on that very run: hold the primary at its first value."""
    run = json.loads((HERE / "file_selection_learning_run.json").read_text())
    flat = [{**s, run["primary"]: run["steps"][0][run["primary"]]} for s in run["steps"]]
    assert {f.metric for f in replay(flat, run["primary"])} >= {"sub_rewards/files"}


def record(reward: float, answer: str, calls: int = 1) -> dict:
    return {
        "reward": reward,
        "grade": {"sub_scores": {"answer": reward}},
        "num_tool_calls": calls,
        "turns": [{"text": answer}],
    }


def test_step_stats_reads_rollout_records() -> None:
    stats = step_stats(
        [record(1.0, "Paris"), record(0.0, "[]", calls=0), record(0.5, "Paris"), {"reward": None}]
    )
    assert stats[REWARD] == pytest.approx(0.5)
    assert stats["sub_rewards/answer"] == pytest.approx(0.5)
    assert stats[EMPTY] == pytest.approx(1 / 3)
    assert stats["hack_watch/no_tool_calls"] == pytest.approx(1 / 3)
    assert stats["hack_watch/top_answer_share"] == pytest.approx(2 / 3)


def test_reward_rising_while_answers_go_empty_is_a_collapse(tmp_path: Path) -> None:
    """Synthetic: each step one more of 4 rollouts answers nothing, and the reward rises."""
    watch = HackWatch(tmp_path, REWARD, seed=1)
    out = {}
    for step in range(1, 6):
        empty = min(step - 1, 4)
        recs = [record(0.2 * step, "") for _ in range(empty)] + [
            record(0.2 * step, f"answer {i}") for i in range(4 - empty)
        ]
        out = watch.observe(step, recs)
    assert out["hack_watch/collapse"] == 1.0
    assert out["hack_watch/flags"] >= 1.0
    lines = (tmp_path / "hack_watch.jsonl").read_text().splitlines()
    assert any(json.loads(ln)["metric"] == EMPTY for ln in lines)
    pages = sorted(p.name for p in (tmp_path / "readings").glob("*.html"))
    assert pages == [f"step-{i}.html" for i in range(1, 6)]
    assert "top-rewarded rollout" in (tmp_path / "readings" / "step-5.html").read_text()


def test_a_flat_run_raises_nothing() -> None:
    rows = [{"step": i, REWARD: 0.3, "sub_rewards/a": 0.3, EMPTY: 0.0} for i in range(10)]
    assert replay(rows, REWARD) == []
    assert flags_at(rows[:2], REWARD) == []  # fewer steps than the window: no judgement


def test_a_flag_reaches_the_service_events_message() -> None:
    from agentrft.service.executor import metrics_message

    row = {"step": 5, REWARD: 0.4, "hack_watch/flags": 1.0}
    assert "hack watch: 1 flag(s)" in metrics_message(row, 8)
    assert "hack watch" not in metrics_message({**row, "hack_watch/flags": 0.0}, 8)
