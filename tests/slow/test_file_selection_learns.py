"""The headline demo learns: `agentrft demo` on one seed, and held-out exact file F1 rises
(slow: `pytest -m slow tests/slow/test_file_selection_learns.py`, 12-25 minutes on 2 CPU
cores). The recipe README reports the same run over three seeds (`agentrft demo --seeds 1 2 3`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrft.tasks import runner as recipes

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_held_out_exact_file_f1_rises_after_the_demos_training():
    demo = recipes.load("file_selection")
    summary = demo.run(ROOT / "runs" / "slow" / "file-selection-seed1", seed=1)
    before, after = summary["before"]["mean file F1"], summary["after"]["mean file F1"]
    gain = summary["per_row"]["difference"]
    print(
        f"held-out exact file F1: {before:.3f} -> {after:.3f}; per-row gain {gain['mean']:+.3f} ({gain['low']:+.3f} .. {gain['high']:+.3f})"
    )
    assert summary["rows"]["val"] >= 16
    assert after > before + 0.05
