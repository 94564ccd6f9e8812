"""The package layering DESIGN's data flow promises, checked on the source (no imports run).

- Nothing under agentrft/ imports the CLI: `cli.py` is argument parsing only.
- The stages that evaluation and training call (rollout/, graders/) never import them back.
- The tool-call budget becomes a rollout cap in one place, `agentrft.runtime`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "agentrft"
SOURCES = sorted(PACKAGE.rglob("*.py"))


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


def test_nothing_under_agentrft_imports_the_cli() -> None:
    assert len(SOURCES) > 20
    others = [p for p in SOURCES if p != PACKAGE / "cli.py"]
    assert importers_of("agentrft.cli", others) == [], (
        "cli.py is argument parsing only: move what these need out of it"
    )


@pytest.mark.parametrize("stage", ["rollout", "graders"])
@pytest.mark.parametrize("caller", ["agentrft.evaluate", "agentrft.train", "agentrft.runtime"])
def test_rollout_and_graders_never_import_their_callers(stage: str, caller: str) -> None:
    files = sorted((PACKAGE / stage).rglob("*.py"))
    assert importers_of(caller, files) == []


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
