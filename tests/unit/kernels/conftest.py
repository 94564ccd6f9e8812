"""Fixtures for the kernels recipe: its grading modules, its job's grader (run in the
sandbox, as in training) and the rows of its shipped data."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "agentrft" / "tasks" / "kernels"


@pytest.fixture(scope="session")
def recipe_modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    """(static_checks, grading), imported from the recipe's folder."""
    sys.path.insert(0, str(RECIPE))
    try:
        import grading
        import static_checks

        yield static_checks, grading
    finally:
        sys.path.remove(str(RECIPE))


@pytest.fixture(scope="session")
def static_checks(recipe_modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return recipe_modules[0]


@pytest.fixture(scope="session")
def grading(recipe_modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return recipe_modules[1]


@pytest.fixture(scope="session")
def items() -> dict[str, dict[str, Any]]:
    """The shipped rows by task name, without their messages (the grader's `item`)."""
    rows = [
        json.loads(line)
        for split in ("train", "val")
        for line in (RECIPE / "data" / f"{split}.jsonl").read_text().splitlines()
    ]
    return {r["task"]: {k: v for k, v in r.items() if k != "messages"} for r in rows}


@pytest.fixture(scope="session")
def job_grader() -> Any:
    """The grader of recipes/kernels/job.yaml, built as a run builds it."""
    from agentrft.graders import build_grader
    from agentrft.job import load_job

    job = load_job(RECIPE / "job.yaml")
    return build_grader(
        job.rl.grader, judge=job.agentrft.judge, python_limits=job.agentrft.sandbox.limits()
    )


def answer(code: str) -> dict[str, Any]:
    """A sample whose final answer is `code` in a python block, as the model replies."""
    return {"output_text": f"Here is a faster kernel.\n```python\n{code.strip()}\n```\n"}
