"""The package's layering, checked on the source (no imports run).

- LAYERS orders the package's modules and folders from the bottom floor to the top: no import
  (at module level, inside a function, or under TYPE_CHECKING) points to a higher floor.
  Modules on one floor may import each other. A new module or folder must be given a floor.
- Nothing under agentrft/ imports the CLI (agentrft/cli/: argument parsing and printing).
- The tool-call budget becomes a rollout cap in one place, `agentrft.runtime`.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentrft"


# not data a task builds beside its jobs (agentrft/tasks/NAME/data*/: snapshotted repositories)
def _built_data(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return len(parts) > 3 and parts[0] == "tasks" and parts[2].startswith("data")


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if not _built_data(p))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """Every module `path` imports, at module level or inside functions; relative imports
    resolved against its package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, package_dir).split(".")
    package = name if path.name == "__init__.py" else name[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package[: len(package) - node.level + 1], *([base] if base else [])]
                )
            found.add(base)
            found.update(
                f"{base}.{alias.name}" for alias in node.names
            )  # `from agentrft import cli`
    return found


def importers_of(target: str, among: list[Path]) -> list[str]:
    return [
        module_name(p)
        for p in among
        if any(m == target or m.startswith(target + ".") for m in imported_modules(p))
    ]


def test_the_scan_sees_imports_in_every_form(tmp_path: Path) -> None:
    pkg = tmp_path / "agentrft" / "sub"
    pkg.mkdir(parents=True)
    src = pkg / "mod.py"
    src.write_text(
        "import agentrft.cli\nfrom agentrft import cli\ndef f():\n    from ..cli import main\n    from . import sibling\n"
    )
    found = imported_modules(src, tmp_path / "agentrft")
    assert {"agentrft.cli", "agentrft.cli.main", "agentrft.sub.sibling"} <= found


# The floors, bottom first: the vocabulary and leaf helpers, then the data flow's stages in
# the order they call each other (tools <- policy <- rollout <- graders <- job <- runtime <-
# evaluate <- train), then what serves and runs them, and the CLI on top.
LAYERS: list[set[str]] = [
    {
        "errors",
        "types",
        "seeds",
        "cgroups",
        "syscall_filter",
        "memory",
        "redact",
        "config",
        "lifetime",
    },
    {"console", "sandbox", "data"},
    {"tools"},
    {"policy"},
    {"rollout", "engine"},
    {"graders"},
    {"job"},
    {"runtime"},
    {"evaluate"},
    {"train"},
    {"serve"},
    {"service"},
    {"tasks"},
    {"cli"},
]


def floor_of(module: str) -> int | None:
    """The floor of `agentrft.X...` (X a top-level module or folder); None for agentrft itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), -1)


def upward_imports(sources: list[Path], package: Path = PACKAGE) -> list[str]:
    """'importer -> imported (floor a -> floor b)' for every import that points up."""
    found = []
    for path in sources:
        importer = module_name(path, package)
        low = floor_of(importer)
        for target in sorted(imported_modules(path, package)):
            high = floor_of(target) if target.startswith("agentrft.") else None
            if low is not None and high is not None and high > low:
                found.append(f"{importer} -> {target} (floor {low} -> {high})")
    return found


def test_every_module_and_folder_has_a_floor() -> None:
    names = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in SOURCES}
    unplaced = sorted(n for n in names - {"__init__"} if floor_of(f"agentrft.{n}") == -1)
    assert unplaced == [], f"give these a floor in LAYERS: {unplaced}"


def test_no_import_points_up_a_floor() -> None:
    assert len(SOURCES) > 20
    assert upward_imports(SOURCES) == []


def test_the_check_sees_an_upward_import_lazy_or_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "agentrft" / "graders"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom agentrft.types import Grade\n"
        "if TYPE_CHECKING:\n    from agentrft.job import Job\n"
        "def f():\n    from agentrft.train import loop\n"
    )
    found = upward_imports(sorted(pkg.glob("*.py")), tmp_path / "agentrft")
    assert found == [
        "agentrft.graders.a -> agentrft.job (floor 5 -> 6)",
        "agentrft.graders.a -> agentrft.job.Job (floor 5 -> 6)",
        "agentrft.graders.a -> agentrft.train (floor 5 -> 9)",
        "agentrft.graders.a -> agentrft.train.loop (floor 5 -> 9)",
    ]


def test_nothing_under_agentrft_imports_the_cli() -> None:
    others = [p for p in SOURCES if p.relative_to(PACKAGE).parts[0] != "cli"]
    assert importers_of("agentrft.cli", others) == [], (
        "agentrft/cli/ is argument parsing and printing only: move what these need out of it"
    )


def calls_to(name: str, path: Path) -> int:
    tree = ast.parse(path.read_text(), filename=str(path))
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == name
    )


def test_the_tool_budget_becomes_a_cap_only_in_runtime() -> None:
    assert [module_name(p) for p in SOURCES if calls_to("tool_call_limit", p)] == [
        "agentrft.runtime"
    ]
