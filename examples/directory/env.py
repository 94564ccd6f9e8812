"""Employee-directory environment: one lookup tool over fictional people, so the model cannot
answer from memory and must call the tool and read the right field of its output.

Used by the learning-curve and tool-budget experiments (tests/slow) and as a second example.
"""

import json
from pathlib import Path

from agentrft.tools.envkit import ToolInputError, ToolServer

PEOPLE = {
    p["name"].lower(): p for p in json.loads((Path(__file__).parent / "people.json").read_text())
}

env = ToolServer("directory")


@env.tool(
    description="Look up an employee by full name: extension, office, team and manager.",
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string", "description": "Full name, e.g. Ada Quint"}},
        "required": ["name"],
    },
)
def lookup_employee(ctx, name: str) -> str:
    person = PEOPLE.get(" ".join(name.split()).lower())
    if person is None:
        raise ToolInputError(f"no employee named {name!r}")
    return ", ".join(f"{k}: {person[k]}" for k in ("extension", "office", "team", "manager"))


app = env.app
