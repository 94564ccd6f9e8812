"""Quickstart environment: one tool that looks up facts about a country.

Run by agentrft for the job (see job.yaml, `agentrft.environment`), or by hand:
    uvicorn env:app --port 8700
"""

from agentrft.tools.envkit import ToolInputError, ToolServer

COUNTRIES = {
    "france": {"capital": "Paris", "currency": "euro", "continent": "Europe"},
    "japan": {"capital": "Tokyo", "currency": "yen", "continent": "Asia"},
    "kenya": {"capital": "Nairobi", "currency": "Kenyan shilling", "continent": "Africa"},
    "brazil": {"capital": "Brasilia", "currency": "real", "continent": "South America"},
    "canada": {"capital": "Ottawa", "currency": "Canadian dollar", "continent": "North America"},
    "egypt": {"capital": "Cairo", "currency": "Egyptian pound", "continent": "Africa"},
    "peru": {"capital": "Lima", "currency": "sol", "continent": "South America"},
    "norway": {"capital": "Oslo", "currency": "Norwegian krone", "continent": "Europe"},
    "india": {"capital": "New Delhi", "currency": "Indian rupee", "continent": "Asia"},
    "australia": {"capital": "Canberra", "currency": "Australian dollar", "continent": "Oceania"},
    "chile": {"capital": "Santiago", "currency": "Chilean peso", "continent": "South America"},
    "poland": {"capital": "Warsaw", "currency": "zloty", "continent": "Europe"},
}

env = ToolServer("quickstart")


@env.tool(
    description="Look up the capital, currency and continent of a country.",
    parameters={
        "type": "object",
        "properties": {"country": {"type": "string", "description": "Country name, e.g. France"}},
        "required": ["country"],
    },
)
def lookup_country(ctx, country: str) -> str:
    facts = COUNTRIES.get(country.strip().lower())
    if facts is None:
        raise ToolInputError(
            f"unknown country {country!r}; known: {', '.join(sorted(c.title() for c in COUNTRIES))}"
        )
    return ", ".join(f"{k}: {v}" for k, v in facts.items())


app = env.app
