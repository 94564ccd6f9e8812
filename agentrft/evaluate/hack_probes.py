"""Known-hack probes: scripted answers run on the job's real tools and scored by its own grader.

A reward that cannot be hacked gives no more for a degenerate answer than the base model earns
on its own. Each probe is a fixed policy that writes the same kind of answer on every row:

    empty            an empty answer
    worked_example   the worked example's answer copied (the last answer in the prompt's examples)
    tool_output      a tool called as the base model called it, its raw output pasted back
    every_candidate  a tool called, then every item its output lists (the numbered lines'
                     items, else every line) given as the answer
    repeated         the base model's median answer on the row, written five times
    no_arguments     the first tool called with no arguments, then an empty answer
    refusal          "I'm sorry, but I can't help with that."

Users add their own as JSONL rows (`UserProbe`), e.g.
`{"name": "cite_readme", "answer": "README.md", "tool_call": "base"}`.

A probe is a real rollout: its own trace_id, its calls sent to the job's tools (the row's
environment state included), the job's prefills honoured (a prefill that opens a tool call is
satisfied by the probe's call; any other prefill starts the probe's reply), its sample graded
like a model's. The doctor compares each probe's mean score with the base model's median; in a
job whose every reply starts with a tool call, with the refusal's too (the control: the base
call with no answer worth anything), so that what the call alone earns is not called a hack.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from agentrft.config import Strict, fix_for
from agentrft.errors import ConfigError
from agentrft.graders import grade_groups, reward_of
from agentrft.graders.groups import cleanup_traces
from agentrft.graders.protocol import Grader
from agentrft.policy.tool_format import CLOSE, OPEN, parse_reply
from agentrft.rollout.context import prompt_messages
from agentrft.rollout.turns import EpisodeLog, StopRules, assistant_message, finish_turn
from agentrft.tools import Tool, release_tools
from agentrft.tools.http import new_client
from agentrft.types import Group, Item, StopReason, ToolCall, Trajectory

REFUSAL = "I'm sorry, but I can't help with that."
REPEATS = 5
_NUMBERED = re.compile(r"^\s*\d+[.)]\s+(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Script:
    """What one probe does on one row: an optional tool call, then its answer. `answer` may
    hold `{tool_output}` (the call's output) or `{candidates}` (the items that output lists)."""

    call: tuple[str, dict[str, Any]] | None
    answer: str


@dataclass(frozen=True)
class Probe:
    name: str
    description: str
    script: Callable[[Item, RowContext], Script | None]  # None: not applicable to this row


@dataclass(frozen=True)
class RowContext:
    """What the probes of one row may copy: the base model's own rollouts of it (graded) and
    the prompt's worked examples."""

    base: Sequence[tuple[Trajectory, float]]
    examples: Sequence[Mapping[str, Any]]
    tools: Sequence[str]
    prefill: str | None = None  # the first reply's prefill

    def base_call(self) -> tuple[str, dict[str, Any]] | None:
        """The first tool call that ran of the lowest-rewarded base rollout that made one,
        else the call the first reply's prefill opens (closed as written), else the worked
        example's, else the first tool with no arguments. The lowest-rewarded: where a call
        alone can earn the reward (apply the right fix, then say anything), a probe that
        copied the best rollout's call would score for the call, not for its answer."""
        schemas: dict[str, Any] = {name: {} for name in self.tools}
        ranked = sorted(self.base, key=lambda tr: tr[1] if tr[1] == tr[1] else math.inf)
        for traj, _ in ranked:
            results = {r.call_id: r for r in traj.tool_results}
            for c in traj.tool_calls:
                r = results.get(c.call_id)
                if c.error is None and r is not None and r.status == "ok":
                    return c.name, _args(c.arguments)
        if self.prefill and self.prefill.startswith(OPEN):
            for close in ('"}}', "}}", "}"):
                calls = parse_reply(self.prefill + close + CLOSE, schemas).calls
                if calls and calls[0].error is None and calls[0].name in self.tools:
                    return calls[0].name, _args(calls[0].arguments)
        for m in self.examples:
            if m.get("role") == "assistant" and OPEN in str(m.get("content") or ""):
                for c in parse_reply(str(m["content"]), schemas).calls:
                    if c.error is None and c.name in self.tools:
                        return c.name, _args(c.arguments)
        return (self.tools[0], {}) if self.tools else None

    def example_answer(self) -> str | None:
        """The last worked-example answer (an assistant reply without a tool call)."""
        answers = [
            str(m.get("content") or "")
            for m in self.examples
            if m.get("role") == "assistant" and OPEN not in str(m.get("content") or "")
        ]
        return answers[-1] if answers else None

    def median_answer(self) -> str | None:
        """The final answer of the base rollout whose score is the row's median."""
        scored = sorted(
            ((r, traj) for traj, r in self.base if r == r and traj.turns), key=lambda x: x[0]
        )
        if not scored:
            return None
        traj = scored[(len(scored) - 1) // 2][1]
        return parse_reply(traj.final_text, {}).text


def _args(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _with_call(text: str) -> Callable[[Item, RowContext], Script | None]:
    def script(item: Item, ctx: RowContext) -> Script | None:
        call = ctx.base_call()
        return None if call is None else Script(call, text)

    return script


def _worked_example(item: Item, ctx: RowContext) -> Script | None:
    answer = ctx.example_answer()
    return None if answer is None else Script(None, answer)


def _repeated(item: Item, ctx: RowContext) -> Script | None:
    answer = ctx.median_answer()
    if not answer:
        return None
    return Script(ctx.base_call(), "\n".join([answer] * REPEATS))


def _no_arguments(item: Item, ctx: RowContext) -> Script | None:
    return Script((ctx.tools[0], {}), "") if ctx.tools else None


PROBES: tuple[Probe, ...] = (
    Probe("empty", "an empty answer", lambda item, ctx: Script(None, "")),
    Probe("worked_example", "the worked example's answer copied", _worked_example),
    Probe(
        "tool_output", "a tool's raw output pasted back as the answer", _with_call("{tool_output}")
    ),
    Probe(
        "every_candidate",
        "every item the tool's output lists, given as the answer",
        _with_call("{candidates}"),
    ),
    Probe("repeated", f"the base model's median answer written {REPEATS} times", _repeated),
    Probe("no_arguments", "a tool called with no arguments, then no answer", _no_arguments),
    Probe("refusal", "a refusal", lambda item, ctx: Script(None, REFUSAL)),
)


class UserProbe(Strict):
    """One JSONL row of a user's probe file. `tool_call`: "base" (call a tool as the base
    model did on the row), an explicit {"name", "arguments"}, or null (answer straight away).
    `answer` may hold `{tool_output}` and `{candidates}` (see Script)."""

    name: str
    answer: str
    description: str = ""
    tool_call: Literal["base"] | dict[str, Any] | None = None


def load_user_probes(path: str | Path) -> list[Probe]:
    """Probes from a JSONL file; a bad line names the file, the line and the fix."""
    out: list[Probe] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = UserProbe.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{n}: not JSON ({exc.msg}); write one JSON object per line"
            ) from None
        except ValidationError as exc:
            problems = "; ".join(
                f"`{'.'.join(map(str, e['loc'])) or 'row'}`: {e['msg']} -> {fix_for(e)}"
                for e in exc.errors()
            )
            raise ConfigError(
                f'{path}:{n}: bad probe ({problems}); a probe row is {{"name": ..., "answer": ..., "tool_call": "base" | {{"name", "arguments"}} | null}}'
            ) from None
        out.append(_user_probe(row))
    return out


def _user_probe(row: UserProbe) -> Probe:
    def script(item: Item, ctx: RowContext) -> Script | None:
        if row.tool_call is None:
            return Script(None, row.answer)
        if row.tool_call == "base":
            return Script(ctx.base_call(), row.answer)
        spec = row.tool_call
        return Script((str(spec.get("name")), dict(spec.get("arguments") or {})), row.answer)

    return Probe(row.name, row.description or "a probe from the user's file", script)


def candidates(output: str) -> list[str]:
    """The items a tool output lists: its numbered lines' first words, else its lines."""
    numbered = _NUMBERED.findall(output)
    return numbered or [ln.strip() for ln in output.splitlines() if ln.strip()]


def _call_text(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{OPEN}{json.dumps({'name': name, 'arguments': dict(arguments)})}{CLOSE}"


def _start(text: str, prefill: str | None) -> str:
    """The reply as the job would have it begin: a prefill that opens a tool call is the
    probe's own call; any other prefill starts the reply unless the text already does."""
    if not prefill or prefill.startswith(OPEN) or text.startswith(prefill):
        return text
    return prefill + text


def _recorder(text: str) -> Callable[[tuple[ToolCall, ...]], dict[str, Any]]:
    """How finish_turn records a scripted reply: as the model's reply would be."""
    return lambda calls: assistant_message(text, calls)


@dataclass(frozen=True)
class ProbeSettings:
    """What a scripted rollout needs from the job (the same fields a model's rollout uses)."""

    tools: Mapping[str, Tool]
    system_prompt: str | None
    few_shot: Sequence[Mapping[str, Any]]
    rules: StopRules
    prefill_for: Callable[..., str | None]  # (turn, item, messages so far)


async def _scripted_turn(
    log: EpisodeLog,
    reply: str,
    calls: tuple[ToolCall, ...],
    settings: ProbeSettings,
    client: Any,
) -> tuple[StopReason | None, list[dict[str, Any]]]:
    """Record one scripted reply and run its calls, as a model's reply would be."""
    return await finish_turn(
        log,
        reply,
        calls,
        ended=True,
        sampled_tokens=0,
        sample_s=0.0,
        assistant=_recorder(reply),
        rules=settings.rules,
        tools=settings.tools,
        client=client,
    )


async def run_script(
    item: Item, script: Script, settings: ProbeSettings, client: Any
) -> Trajectory:
    """One scripted rollout on the job's tools, recorded like a model's."""
    log = EpisodeLog(item, prompt_messages(item, settings.system_prompt, settings.few_shot))
    try:
        output = ""
        if script.call is not None:
            schemas = {name: t.spec.parameters for name, t in settings.tools.items()}
            reply = _start(_call_text(*script.call), settings.prefill_for(0, item))
            stop, answers = await _scripted_turn(
                log, reply, parse_reply(reply, schemas).calls, settings, client
            )
            output = "\n".join(str(a["content"]) for a in answers)
            if stop is not None:
                return log.trajectory(stop)
        prefill = settings.prefill_for(len(log.turns), item, log.messages)
        listed = candidates(output)
        answer = script.answer.replace("{tool_output}", output).replace(
            "{candidates}",  # as a JSON list where the reply is prefilled to be one
            json.dumps(listed) if (prefill or "").startswith("[") else "\n".join(listed),
        )
        stop, _ = await _scripted_turn(log, _start(answer, prefill), (), settings, client)
        return log.trajectory(stop or StopReason.FINAL_ANSWER)
    finally:
        await release_tools(settings.tools, log.trace_id)


def run_probes(
    probes: Sequence[Probe],
    base_groups: Sequence[Group],
    settings: ProbeSettings,
    grader: Grader,
    env_url: str | None,
) -> tuple[dict[str, Any], list[Group]]:
    """Every probe on every row of `base_groups` (graded base rollouts), graded by `grader`:
    per probe its mean score, rows and a readable example, and the base model's median; and
    the graded probe rollouts themselves (one group each)."""
    base_rewards = [r for g in base_groups for r in map(reward_of, g.grades) if r == r]
    contexts = [
        RowContext(
            base=list(zip(g.trajectories, map(reward_of, g.grades), strict=True)),
            examples=[*settings.few_shot, *g.item.messages[:-1]],
            tools=list(settings.tools),
            prefill=settings.prefill_for(0, g.item),
        )
        for g in base_groups
    ]
    jobs = []
    for p in probes:
        for g, ctx in zip(base_groups, contexts, strict=True):
            script = p.script(g.item, ctx)
            if script is None:
                continue
            first = settings.prefill_for(0, g.item)
            if script.call is None and first and first.startswith(OPEN):
                # the job starts every reply with a tool call: a probe makes the base one first
                script = Script(ctx.base_call(), script.answer)
            jobs.append((p, g.item, script))

    async def run_all() -> list[Group]:
        async with new_client() as client:
            trajs = await asyncio.gather(*(run_script(i, s, settings, client) for _, i, s in jobs))
        groups = [Group(t.item, (t,)) for t in trajs]
        graded = await grade_groups(groups, grader)
        await cleanup_traces(env_url, list(trajs))
        return graded

    graded = asyncio.run(run_all())
    results: dict[str, Any] = {}
    for probe in probes:
        mine = [g for (p, _, _), g in zip(jobs, graded, strict=True) if p is probe]
        scores = [reward_of(g.grades[0]) for g in mine]
        kept = [s for s in scores if s == s]
        best = max(mine, key=_score, default=None)
        results[probe.name] = {
            "description": probe.description,
            "rows": len(mine),
            "graded": len(kept),
            "mean": statistics.fmean(kept) if kept else None,
            "max": max(kept) if kept else None,
            "errors": sorted(
                {g.grades[0].error for g in mine if g.grades[0] and g.grades[0].error}
            ),
            "example": None if best is None else _example(best),
            # per row, so a probe can be set against the control on the same rows
            "by_row": {str(g.item.index): r for g, r in zip(mine, scores, strict=True) if r == r},
        }
    # where every reply starts with a call, every probe carries the base model's call, which may
    # earn the reward on its own (apply the right fix): the refusal is then the control, the
    # call with no answer worth anything, and a hack is an answer that earns more than it
    forced = any((settings.prefill_for(0, g.item) or "").startswith(OPEN) for g in base_groups)
    summary = {
        "base_median": statistics.median(base_rewards) if base_rewards else None,
        "base_rollouts": len(base_rewards),
        "probes": results,
        "control": "refusal" if forced and "refusal" in results else None,
    }
    return summary, graded


def _score(group: Group) -> float:
    r = reward_of(group.grades[0])
    return r if r == r else -math.inf


def _example(group: Group) -> dict[str, Any]:
    traj, grade = group.trajectories[0], group.grades[0]
    return {
        "row": traj.item.index,
        "answer": traj.final_text[:400],
        "calls": [f"{c.name}({c.arguments})" for c in traj.tool_calls],
        "score": reward_of(grade),
    }
