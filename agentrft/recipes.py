"""Find the recipes (`recipes/NAME/`, one folder per use case) that `agentrft demo NAME` runs.

A recipe is a folder of the agentrft checkout holding a `demo.py` with the same small
interface:

    run(out: Path, steps: int | None = None, seed: int | None = None, job_path: Path | None = None) -> dict
        the use case end to end: data, baseline, pre-flight, train, compare, report; returns
        the summary it also writes to out/summary.json
    run_seeds(out: Path, seeds: list[int], steps=None, job_path=None) -> dict   (optional)
        `run` once per seed, and the gain over all of them with a 95% interval

beside its environment, job and README. Recipes are found on disk, not registered: a new
folder with a demo.py is a new recipe.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from agentrft.errors import ConfigError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
DEFAULT = "file_selection"


def available(root: Path = RECIPES) -> list[str]:
    """The recipe names under `root`, sorted."""
    return sorted(p.parent.name for p in root.glob("*/demo.py"))


def load(name: str = DEFAULT, root: Path = RECIPES) -> ModuleType:
    """The recipe's demo module; ConfigError naming the recipes there are when `name` is not one."""
    script = root / name / "demo.py"
    if not script.is_file():
        names = available(root)
        if not names:
            raise ConfigError(
                f"no recipes under {root}: `agentrft demo` runs from a checkout of the agentrft repository"
            )
        raise ConfigError(f"no recipe {name!r} -> one of: {', '.join(names)}")
    spec = importlib.util.spec_from_file_location(f"agentrft_recipe_{name}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise ConfigError(
            f"{script}: a recipe's demo.py defines run(out, steps=None, seed=None, job_path=None)"
        )
    return module
