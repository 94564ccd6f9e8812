"""In-process tools used by the tool tests (`function: "tests.unit.pytools:add"`)."""

CALLS: list[str] = []


def add(a: float, b: float) -> float:
    CALLS.append("add")
    return a + b if (a + b) != int(a + b) else int(a + b)


def whoami(trace_id: str, item: dict) -> dict:
    CALLS.append("whoami")
    return {"trace_id": trace_id, "item": item}


def fragile() -> str:
    CALLS.append("fragile")
    raise RuntimeError("database unreachable")


COUNTRIES = {"peru": "capital: Lima", "norway": "capital: Oslo"}


def lookup(country: str) -> str:
    """Facts about a country; an unknown one is the caller's mistake (the 4xx path)."""
    from agentrft.tools import ToolInputError

    CALLS.append("lookup")
    if country.lower() not in COUNTRIES:
        raise ToolInputError(f"unknown country {country!r}")
    return COUNTRIES[country.lower()]
