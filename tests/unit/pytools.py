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
