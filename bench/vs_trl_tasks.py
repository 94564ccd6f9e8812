"""The two tasks `train_vs_trl.py` runs on both agentrft and TRL, defined once so both sides
get the same rows, prompts, reward and tool.

- single: one-word questions; reward = fuzzy similarity of the reply to the expected word.
- multi: the employee directory of `examples/directory` with its lookup tool implemented in
  Python (in process on both sides) and a tools-capable ChatML chat template (TRL's own
  `qwen2_5.jinja`, which fits SmolLM2's <|im_start|>/<|im_end|> tokens); reward = fuzzy
  similarity of the final answer to the expected field.

The reward is agentrft's `text_similarity` / `fuzzy_match` (rapidfuzz WRatio): agentrft runs
it as its built-in grader, TRL calls the same function from a reward function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.graders.text_similarity import similarity

REPO = Path(__file__).resolve().parents[1]
DIRECTORY = REPO / "examples" / "directory"

WORDS = [
    ("What is the opposite of hot?", "cold"),
    ("What color is the sky on a clear day?", "blue"),
    ("Which animal says meow?", "cat"),
    ("What is frozen water called?", "ice"),
    ("What is the opposite of up?", "down"),
    ("Which planet do we live on?", "Earth"),
    ("What color is grass?", "green"),
    ("What do bees make?", "honey"),
    ("What is the opposite of day?", "night"),
    ("Which fruit is yellow and long?", "banana"),
    ("How many legs does a spider have? Answer in letters.", "eight"),
    ("What is the capital of France?", "Paris"),
    ("Which animal barks?", "dog"),
    ("What falls from clouds when it rains?", "water"),
    ("What is the opposite of big?", "small"),
    ("What do you call a baby cat?", "kitten"),
    ("Which season comes after winter?", "spring"),
    ("What color is snow?", "white"),
    ("What is the opposite of fast?", "slow"),
    ("Which star lights the day?", "sun"),
    ("What is the opposite of open?", "closed"),
    ("What do cows drink?", "water"),
    ("What is the largest ocean?", "Pacific"),
    ("Which bird is a symbol of peace?", "dove"),
]

SYSTEM_DIRECTORY = "You answer questions about employees. Call lookup_employee with the person's full name, then answer with the field that was asked for."
# The two worked examples of examples/directory/job.yaml. With one, SmolLM2-135M almost never
# calls the tool (0/32 sampled first replies); with two, about 1 in 5 is a well-formed call.
# Calls are written as text in the template's own format: agentrft renders message content
# only (see RESULTS.md).
FEW_SHOT_DIRECTORY = [
    {"role": "user", "content": "What is the phone extension of Lena Brook?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "lookup_employee", "arguments": {"name": "Lena Brook"}}\n</tool_call>',
    },
    {"role": "tool", "content": "extension: 5513, office: C-210, team: Mobile, manager: Otto Fenn"},
    {"role": "assistant", "content": "The extension of Lena Brook is 5513."},
    {"role": "user", "content": "Who is the manager of Arlo Finch?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "lookup_employee", "arguments": {"name": "Arlo Finch"}}\n</tool_call>',
    },
    {
        "role": "tool",
        "content": "extension: 2290, office: A-118, team: Search, manager: Mae Corrin",
    },
    {"role": "assistant", "content": "The manager of Arlo Finch is Mae Corrin."},
]

_PEOPLE = {p["name"].lower(): p for p in json.loads((DIRECTORY / "people.json").read_text())}


# No "-> str" annotation: transformers would add a "return" key to the schema TRL renders,
# which agentrft's tool spec has no field for, and the two prompts would differ.
def lookup_employee(name: str):
    """Look up an employee by full name: extension, office, team and manager.

    Args:
        name: Full name, e.g. Ada Quint
    """
    person = _PEOPLE.get(" ".join(str(name).split()).lower())
    if person is None:
        raise ValueError(f"no employee named {name!r}")
    return ", ".join(f"{k}: {person[k]}" for k in ("extension", "office", "team", "manager"))


def fuzzy(text: str, answer: str) -> float:
    """The reward of both sides: agentrft's fuzzy_match (rapidfuzz WRatio / 100)."""
    return similarity("fuzzy_match", text, answer)


@dataclass(frozen=True)
class Task:
    name: str
    rows: list[dict[str, Any]]  # dataset rows: {"messages": [...], "answer": ...}
    system_prompt: str | None = None
    few_shot: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)  # Python callables (TRL) = agentrft python tools
    max_turns: int = 1  # model replies per rollout

    def prompt(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation both sides start from (agentrft's ChatRenderer builds the same)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [dict(m) for m in self.few_shot] + [dict(m) for m in row["messages"]]

    def tool_specs(self) -> list[dict[str, Any]]:
        """agentrft tool specs (`function: module:callable`) with the schema transformers
        derives from each callable for TRL, so both prompts render the same tool block."""
        from transformers.utils import get_json_schema

        specs = []
        for fn in self.tools:
            schema = get_json_schema(fn)["function"]
            specs.append(
                {
                    "name": schema["name"],
                    "description": schema["description"],
                    "parameters": schema["parameters"],
                    "function": f"{__name__}:{fn.__name__}",
                }
            )
        return specs


def make_task(name: str, n_rows: int) -> Task:
    if name == "single":
        if n_rows > len(WORDS):
            raise SystemExit(
                f"the single-turn task has {len(WORDS)} rows; {n_rows} needed (lower --rows or --steps)"
            )
        rows = [
            {"messages": [{"role": "user", "content": f"Answer with one word. {q}"}], "answer": a}
            for q, a in WORDS[:n_rows]
        ]
        return Task("single", rows)
    if name == "multi":
        lines = (DIRECTORY / "train.jsonl").read_text().splitlines()
        if n_rows > len(lines):
            raise SystemExit(f"the directory task has {len(lines)} rows; {n_rows} needed")
        rows = [json.loads(line) for line in lines[:n_rows]]
        rows = [{"messages": r["messages"], "answer": r["answer"], "name": r["name"]} for r in rows]
        return Task(
            "multi", rows, SYSTEM_DIRECTORY, FEW_SHOT_DIRECTORY, [lookup_employee], max_turns=3
        )
    raise SystemExit(f"unknown task {name!r}")


def final_text(completion: Any) -> str:
    """TRL's completion (a list of messages, or a string): the last assistant reply's text."""
    if isinstance(completion, str):
        return completion
    replies = [m for m in completion if m.get("role") == "assistant"]
    return str(replies[-1].get("content") or "") if replies else ""


def tools_model_dir(model_dir: Path, target: Path) -> Path:
    """`model_dir` with TRL's ChatML tools template (qwen2_5.jinja) as its chat template:
    the same weights (symlinked), a template both sides render tools with."""
    import trl

    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    target.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name != "chat_template.jinja" and not (target / f.name).exists():
            (target / f.name).symlink_to(f.resolve())
    (target / "chat_template.jinja").write_text(template.read_text())
    return target
