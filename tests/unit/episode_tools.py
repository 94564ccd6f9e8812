"""In-process tools for the episode tests (referenced as "tests.unit.episode_tools:NAME")."""

from agentrft.tools import ToolInputError

FACTS = {"peru": "capital: Lima", "norway": "capital: Oslo"}


def lookup(country: str) -> str:
    if country.lower() not in FACTS:
        raise ToolInputError(f"unknown country {country!r}")
    return FACTS[country.lower()]


def broken(country: str) -> str:
    raise RuntimeError("backend down")
