"""Regenerate people.json, train.jsonl and val.jsonl (deterministic). Validation asks about
people never seen in training, so it measures the skill, not memorised answers."""

import json
import random
from pathlib import Path

FIRST = [
    "Ada",
    "Bram",
    "Cleo",
    "Dario",
    "Elin",
    "Faro",
    "Gita",
    "Hugo",
    "Ines",
    "Jory",
    "Kaia",
    "Lorn",
    "Mira",
    "Nils",
    "Odda",
    "Pim",
    "Quill",
    "Rhea",
    "Sten",
    "Tova",
    "Umar",
    "Vesa",
    "Wren",
    "Xio",
    "Yara",
    "Zeno",
]
LAST = [
    "Quint",
    "Marrow",
    "Vell",
    "Ostrand",
    "Pike",
    "Sorel",
    "Thane",
    "Ubrik",
    "Varga",
    "Wilde",
    "Yost",
    "Zeller",
    "Brask",
    "Coyle",
    "Dunmore",
]
TEAMS = ["Payments", "Search", "Billing", "Security", "Mobile", "Data", "Support", "Infra"]
QUESTIONS = {
    "extension": "What is the phone extension of {name}?",
    "office": "Which office is {name} in?",
    "team": "Which team does {name} work on?",
    "manager": "Who is the manager of {name}?",
}


def main() -> None:
    rng = random.Random(20261129)
    names = rng.sample([f"{first} {last}" for first in FIRST for last in LAST], 64)
    people = []
    for name in names:
        people.append(
            {
                "name": name,
                "extension": str(rng.randint(1000, 9999)),
                "office": f"{rng.choice('ABCDEFG')}-{rng.randint(100, 499)}",
                "team": rng.choice(TEAMS),
                "manager": rng.choice([n for n in names if n != name]),
            }
        )
    here = Path(__file__).parent
    (here / "people.json").write_text(json.dumps(people, indent=1) + "\n")
    rows = []
    for p in people:
        for field in rng.sample(list(QUESTIONS), 2):
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": QUESTIONS[field].format(name=p["name"])}
                    ],
                    "name": p["name"],
                    "field": field,
                    "answer": p[field],
                }
            )
    train, val = rows[:96], rows[96:]  # val: the last 16 people, unseen in training
    for fname, part in (("train.jsonl", train), ("val.jsonl", val)):
        (here / fname).write_text("".join(json.dumps(r) + "\n" for r in part))


if __name__ == "__main__":
    main()
