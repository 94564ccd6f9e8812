"""The repository-research recipe learns: `agentrft demo repo_research` on one seed, and
held-out fact recall rises while the tail of tool calls does not grow (slow:
`pytest -m slow tests/slow/test_repo_research_learns.py`, 15-30 minutes on 2 CPU cores).
The recipe README reports the same run over three seeds
(`agentrft demo repo_research --seeds 1 2 3`: +0.066 on average, seed 1 alone +0.062); this
test asks for +0.03 on seed 1, room for the run-to-run spread of sampling on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrft.tasks import runner as recipes

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_held_out_fact_recall_rises_after_the_demos_training():
    demo = recipes.load("repo_research")
    summary = demo.run(ROOT / "runs" / "slow" / "repo-research-seed1", seed=1)
    before, after = summary["before"], summary["after"]
    gain = summary["per_row"]["difference"]
    print(
        f"held-out fact recall: {before['fact recall']:.3f} -> {after['fact recall']:.3f}; per-question gain {gain['mean']:+.3f} ({gain['low']:+.3f} .. {gain['high']:+.3f}); tool calls p95 {before['tool calls p95']:.2f} -> {after['tool calls p95']:.2f}"
    )
    assert summary["rows"]["val"] >= 24
    assert after["fact recall"] >= before["fact recall"] + 0.03
    assert after["tool calls p95"] <= before["tool calls p95"]
