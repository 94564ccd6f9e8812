"""`fact_recall` (agentrft): the share of reference facts the answer states.

    {"type": "fact_recall", "name": "facts", "input": "{{sample.output_text}}",
     "reference": "{{item.facts}}"}                       # list, or one fact per line
    ... "judge": {<score_model or label_model grader>}, "fact_threshold": 0.5
    ... "max_answer_words": 30                                 # agentrft: longer answers score 0
    ... "path_precision": true                                 # agentrft: extra paths cost

By default a fact counts when its normalised text (case-folded, punctuation to spaces,
whitespace collapsed) appears in the normalised answer on word boundaries. With `judge`,
each fact is graded by that model grader instead, whose messages may also use `{{fact}}`;
the fact counts when the judge scores at least `fact_threshold`. No facts scores 1.0.
A judge error on any fact flags the whole grade with it.

`max_answer_words` closes the cheapest hack of recall: an answer that pastes whole files or
every path it saw states every fact. Past that many words (of the normalised answer) the
score is 0 and the metrics say `too_long`; no judge is asked.

`path_precision` closes the next one, for rows whose facts include file paths: a short list
of candidate paths ("a.py, b.py or c.py") fits under any word cap and states the right one.
With it, the recall is multiplied by the share of the paths the answer states (words with a
`/` and a file extension) that are the row's facts; the metrics list the `extra_paths`.
Rows without a path among their facts are not affected.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from agentrft.errors import ConfigError
from agentrft.graders.protocol import NAN, agrade_safely, failed, grade_safely, run_sync
from agentrft.graders.spec import BuildContext, Strict
from agentrft.graders.template import (
    MissingItemField,
    as_text,
    check_template,
    render,
    render_value,
)
from agentrft.types import Grade

_NON_WORD = re.compile(r"[^\w]+")
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)+\.\w+")  # dir/file.ext: what path_precision counts


class FactRecallSpec(Strict):
    type: Literal["fact_recall"]
    name: str = "fact_recall"
    input: str = "{{sample.output_text}}"
    reference: str | list[str]
    judge: dict[str, Any] | None = None
    fact_threshold: float = 0.5
    max_answer_words: int | None = Field(default=None, ge=1)
    path_precision: bool = False


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_NON_WORD.sub(" ", text).split())


def fact_found(fact: str, answer: str) -> bool:
    f = normalize(fact)
    return bool(f) and f" {f} " in f" {normalize(answer)} "


def _facts(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        items = [as_text(v) for v in value]
    else:
        items = as_text(value).splitlines()
    return [f.strip() for f in items if f.strip()]


class FactRecallGrader:
    type = "fact_recall"

    def __init__(self, spec: FactRecallSpec, judge: Any = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.judge = judge  # a model grader, or None for substring matching

    @property
    def children(self) -> list[Any]:
        return [self.judge] if self.judge is not None else []

    def _inputs(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> tuple[str, list[str]]:
        ns = {"sample": sample, "item": item}
        ref = self.spec.reference
        facts = (
            [f for r in ref for f in _facts(render(r, ns))]
            if isinstance(ref, list)
            else _facts(render_value(ref, ns))
        )
        return render(self.spec.input, ns), facts

    def _too_long(self, answer: str) -> Grade | None:
        limit = self.spec.max_answer_words
        words = len(normalize(answer).split())
        if limit is not None and words > limit:
            return Grade(
                0.0, {}, {"too_long": True, "answer_words": words, "max_answer_words": limit}
            )
        return None

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        if self.judge is not None:
            return run_sync(self.agrade(sample, item, trace_id))

        def run() -> Grade:
            try:
                answer, facts = self._inputs(sample, item)
            except MissingItemField as exc:
                return failed("invalid_variable_error", str(exc))
            return self._too_long(answer) or self._result(
                facts, [fact_found(f, answer) for f in facts], answer
            )

        return grade_safely(run)

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        if self.judge is None:
            return self.grade(sample, item, trace_id)

        async def run() -> Grade:
            try:
                answer, facts = self._inputs(sample, item)
            except MissingItemField as exc:
                return failed("invalid_variable_error", str(exc))
            if (long := self._too_long(answer)) is not None:
                return long
            grades = await asyncio.gather(
                *(self.judge.agrade(sample, item, trace_id, extra={"fact": f}) for f in facts)
            )
            for g in grades:
                if g.error is not None:
                    return Grade(
                        NAN,
                        {},
                        {"error_details": f"judging a fact: {g.metrics.get('error_details', '')}"},
                        g.error,
                    )
            return self._result(
                facts, [g.score >= self.spec.fact_threshold for g in grades], answer
            )

        return await agrade_safely(run)

    def _result(self, facts: list[str], found: list[bool], answer: str) -> Grade:
        score = sum(found) / len(facts) if facts else 1.0
        metrics: dict[str, Any] = {
            "found": [f for f, ok in zip(facts, found, strict=True) if ok],
            "missing": [f for f, ok in zip(facts, found, strict=True) if not ok],
        }
        fact_paths = {normalize(f) for f in facts if _PATH.fullmatch(f.strip())}
        if self.spec.path_precision and fact_paths:
            stated = {normalize(p): p for p in _PATH.findall(answer)}
            if stated:
                score *= len(stated.keys() & fact_paths) / len(stated)
            metrics["extra_paths"] = sorted(p for n, p in stated.items() if n not in fact_paths)
        return Grade(score, {}, metrics)


def build(spec: FactRecallSpec, path: str, ctx: BuildContext) -> FactRecallGrader:
    check_template(spec.input, f"{path}.input")
    for i, r in enumerate([spec.reference] if isinstance(spec.reference, str) else spec.reference):
        check_template(
            r, f"{path}.reference" + ("" if isinstance(spec.reference, str) else f"[{i}]")
        )
    judge = None
    if spec.judge is not None:
        if spec.judge.get("type") not in ("score_model", "label_model"):
            raise ConfigError(
                f"{path}.judge: must be a score_model or label_model grader (its messages may use {{{{fact}}}}), got type {spec.judge.get('type')!r}"
            )
        judge = ctx.child(spec.judge, f"{path}.judge", namespaces=(*ctx.namespaces, "fact"))
    return FactRecallGrader(spec, judge)
