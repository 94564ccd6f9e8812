"""`score_model` and `label_model` (OpenAI): a judge model reads templated messages and
returns a score in `range`, or one of `labels` (1.0 when it is a passing label, else 0.0).

    {"type": "score_model", "name": "...", "model": "o4-mini-2025-04-16",
     "input": [{"role": "system", "content": "..."}, {"role": "user", "content": "{{sample.output_text}}"}],
     "range": [0, 1], "pass_threshold": 0.5,
     "sampling_params": {"temperature": 0, "top_p": 1, "seed": 1, "max_completions_tokens": 512,
                         "reasoning_effort": "low"}}
    {"type": "label_model", "name": "...", "model": "...", "input": [...],
     "labels": ["good", "bad"], "passing_labels": ["good"], "sampling_params": {...}}

Like OpenAI, the judge is asked for `{"steps": [{"description", "conclusion"}], "result": ...}`
(as `response_format` where the endpoint takes it, and always in a system instruction, since
a local model cannot be forced). The reply is read as that JSON, else leniently: the first
number (score) or the first label named (label). A reply with neither flags
`model_grader_parse_error`, where OpenAI would score 0; a refusal flags
`model_grader_refusal_error`; an endpoint that keeps failing, `model_grader_server_error`.
Scores are clipped to `range`. `developer` messages are sent as `system` (local chat
templates and many compatible servers know no other), and content must be text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from agentrft.errors import ConfigError, GraderUnavailable
from agentrft.graders.judge import Judge, JudgeError, JudgeParams, make_judge
from agentrft.graders.protocol import agrade_safely, failed, run_sync
from agentrft.graders.spec import BuildContext, Strict
from agentrft.graders.template import MissingItemField, check_template, render
from agentrft.types import Grade

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_STEPS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"description": {"type": "string"}, "conclusion": {"type": "string"}},
        "required": ["description", "conclusion"],
        "additionalProperties": False,
    },
}


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any
    type: Literal["message"] | None = None


class SamplingSpec(Strict):
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    max_completions_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)  # the name in OpenAI's label_model example
    reasoning_effort: str | None = None

    def params(self) -> JudgeParams:
        return JudgeParams(
            self.temperature,
            self.top_p,
            self.max_completions_tokens or self.max_tokens,
            self.seed,
            self.reasoning_effort,
        )


class ScoreModelSpec(Strict):
    type: Literal["score_model"]
    name: str = "score_model"
    model: str
    input: list[Message] = Field(min_length=1)
    range: list[float] = Field(default_factory=lambda: [0.0, 1.0], min_length=2, max_length=2)
    pass_threshold: float | None = None
    sampling_params: SamplingSpec = Field(default_factory=SamplingSpec)

    @model_validator(mode="after")
    def _range(self) -> ScoreModelSpec:
        if not self.range[0] < self.range[1]:
            raise ValueError(f"range must be [low, high] with low < high, got {self.range}")
        return self


class LabelModelSpec(Strict):
    type: Literal["label_model"]
    name: str = "label_model"
    model: str
    input: list[Message] = Field(min_length=1)
    labels: list[str] = Field(min_length=1)
    passing_labels: list[str] = Field(min_length=1)
    sampling_params: SamplingSpec = Field(default_factory=SamplingSpec)

    @model_validator(mode="after")
    def _subset(self) -> LabelModelSpec:
        extra = [p for p in self.passing_labels if p not in self.labels]
        if extra:
            raise ValueError(f"passing_labels {extra} are not among labels {self.labels}")
        return self


def content_text(content: Any, where: str) -> str:
    """OpenAI message content (a string, a text part, or a list of text parts) as text."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    texts = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif (
            isinstance(p, dict)
            and p.get("type") in ("input_text", "output_text", "text")
            and isinstance(p.get("text"), str)
        ):
            texts.append(p["text"])
        else:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise ConfigError(
                f"{where}: content of type {kind!r} is not supported; agentrft's judges read text (input_text/output_text)"
            )
    return "".join(texts)


def first_json_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    for candidate in (text.strip(), text[start : end + 1] if 0 <= start < end else ""):
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
    return None


def parse_score(text: str) -> float | None:
    obj = first_json_object(text)
    if (
        isinstance(obj, dict)
        and isinstance(obj.get("result"), int | float)
        and not isinstance(obj.get("result"), bool)
    ):
        return float(obj["result"])
    if isinstance(obj, int | float) and not isinstance(obj, bool):
        return float(obj)
    m = _NUMBER.search(text)
    return float(m.group(0)) if m else None


def parse_label(text: str, labels: list[str]) -> str | None:
    by_fold = {lab.casefold(): lab for lab in labels}
    obj = first_json_object(text)
    if (
        isinstance(obj, dict)
        and isinstance(obj.get("result"), str)
        and obj["result"].strip().casefold() in by_fold
    ):
        return by_fold[obj["result"].strip().casefold()]
    bare = text.strip().strip("\"'`.*").strip().casefold()
    if bare in by_fold:
        return by_fold[bare]
    hits = [
        (m.start(), lab)
        for lab in labels
        if (m := re.search(rf"(?<!\w){re.escape(lab)}(?!\w)", text, re.IGNORECASE))
    ]
    return min(hits)[1] if hits else None


class _ModelGrader:
    """What score_model and label_model share: render, ask the judge, map failures."""

    type = ""

    def __init__(self, spec: Any, judge: Judge) -> None:
        self.spec = spec
        self.name = spec.name
        self.judge = judge

    def _result(self) -> tuple[str, dict[str, Any]]:
        """What the reply's `result` is: in words for the instruction, and as JSON schema."""
        raise NotImplementedError

    def _instruction(self) -> str:
        words, _ = self._result()
        return (
            'Reply with JSON only, in this form: {"steps": [{"description": "...", "conclusion": "..."}], '
            f'"result": {words}}}'
        )

    def _response_format(self) -> dict[str, Any]:
        _, result = self._result()
        schema = {
            "type": "object",
            "properties": {"steps": _STEPS, "result": result},
            "required": ["steps", "result"],
            "additionalProperties": False,
        }
        name = self.type.removesuffix("_model")  # "score" or "label"
        return {
            "type": "json_schema",
            "json_schema": {"name": name, "strict": True, "schema": schema},
        }

    def _verdict(self, text: str) -> Grade:
        raise NotImplementedError

    def grade(
        self,
        sample: Mapping[str, Any],
        item: Mapping[str, Any],
        trace_id: str = "",
        extra: Mapping[str, Any] | None = None,
    ) -> Grade:
        return run_sync(self.agrade(sample, item, trace_id, extra))

    async def agrade(
        self,
        sample: Mapping[str, Any],
        item: Mapping[str, Any],
        trace_id: str = "",
        extra: Mapping[str, Any] | None = None,
    ) -> Grade:
        return await agrade_safely(lambda: self._run(sample, item, extra or {}))

    def messages(self, namespaces: Mapping[str, Any]) -> list[dict[str, str]]:
        msgs = [
            {
                "role": "system" if m.role == "developer" else m.role,
                "content": render(content_text(m.content, "input"), namespaces),
            }
            for m in self.spec.input
        ]
        if msgs[0]["role"] == "system":
            msgs[0] = {
                "role": "system",
                "content": msgs[0]["content"] + "\n\n" + self._instruction(),
            }
        else:
            msgs.insert(0, {"role": "system", "content": self._instruction()})
        return msgs

    async def _run(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], extra: Mapping[str, Any]
    ) -> Grade:
        try:
            msgs = self.messages({"sample": sample, "item": item, **extra})
        except MissingItemField as exc:
            return failed("invalid_variable_error", str(exc))
        try:
            reply = await self.judge.complete(
                msgs, self.spec.sampling_params.params(), self._response_format()
            )
        except GraderUnavailable as exc:
            return failed("model_grader_server_error", str(exc), judge=self.judge.model)
        except JudgeError as exc:
            return failed(exc.flag, str(exc), judge=self.judge.model)  # type: ignore[arg-type]
        if reply.refusal:
            return failed("model_grader_refusal_error", reply.refusal, judge=self.judge.model)
        grade = self._verdict(reply.text)
        return Grade(
            grade.score,
            grade.sub_scores,
            {
                **grade.metrics,
                "judge": self.judge.model,
                "judge_reply": reply.text[:2000],
                "token_usage": reply.tokens,
            },
            grade.error,
        )


class ScoreModelGrader(_ModelGrader):
    type = "score_model"

    def _result(self) -> tuple[str, dict[str, Any]]:
        lo, hi = self.spec.range
        return f"<a number from {lo:g} to {hi:g}>", {"type": "number"}

    def _verdict(self, text: str) -> Grade:
        raw = parse_score(text)
        if raw is None:
            return failed(
                "model_grader_parse_error", f"no score in the judge's reply: {text[:300]!r}"
            )
        lo, hi = self.spec.range
        score = min(hi, max(lo, raw))
        metrics: dict[str, Any] = {"raw_score": raw}
        if self.spec.pass_threshold is not None:
            metrics["passed"] = score >= self.spec.pass_threshold
        return Grade(score, {}, metrics)


class LabelModelGrader(_ModelGrader):
    type = "label_model"

    def _result(self) -> tuple[str, dict[str, Any]]:
        labels = list(self.spec.labels)
        return f'"<one of: {", ".join(labels)}>"', {"type": "string", "enum": labels}

    def _verdict(self, text: str) -> Grade:
        label = parse_label(text, list(self.spec.labels))
        if label is None:
            return failed(
                "model_grader_parse_error",
                f"none of the labels {self.spec.labels} in the judge's reply: {text[:300]!r}",
            )
        return Grade(1.0 if label in self.spec.passing_labels else 0.0, {}, {"label": label})


def build(spec: ScoreModelSpec | LabelModelSpec, path: str, ctx: BuildContext) -> _ModelGrader:
    for i, m in enumerate(spec.input):
        where = f"{path}.input[{i}].content"
        check_template(content_text(m.content, where), where, ctx.namespaces)
    judge = make_judge(ctx.judge, spec.model, f"{path}.model", ctx.check_resources, ctx.judges)
    return (ScoreModelGrader if spec.type == "score_model" else LabelModelGrader)(spec, judge)
