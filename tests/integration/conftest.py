"""The real default model, loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def base_policy():  # type: ignore[no-untyped-def]
    from agentrft.policy.load import load_policy

    return load_policy("base")
