"""The two stages training and evaluation share, run as the loop runs them: rollouts from
rollout/ (`rollout_groups`), then grades from graders/ (`grade_rollouts`), with settings from
`agentrft.runtime`. A scripted policy and a real loopback tool server; no model weights."""

from __future__ import annotations

from agentrft.graders import build_grader, grade_rollouts, reward_of
from agentrft.job import job_from_dict
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.group import rollout_groups
from agentrft.runtime import sampling_params, settings_from_job
from agentrft.tools.envkit import ToolServer, serve_in_thread
from agentrft.types import Item, StopReason
from tests.conftest import ScriptedPolicy

STR = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
CALL = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'
GRADER = {  # at most one tool call, and the answer must be "done"
    "type": "tool_budget",
    "name": "budget",
    "max_tool_calls": 1,
    "grader": {
        "type": "string_check",
        "name": "answer",
        "input": "{{sample.output_text}}",
        "reference": "done",
        "operation": "eq",
    },
}


def reply(prompt: str, turn: int) -> str:
    """Row "direct" answers at once; row "chatty" calls the tool on every turn."""
    return CALL if "chatty" in prompt else "done"


def test_rollouts_then_grades_cap_calls_at_the_budget_and_release_every_trace(tokenizer):
    cleaned: list[str] = []
    kit = ToolServer("stages")
    kit.tool(lambda ctx, text: f"echo:{text}", name="echo", parameters=STR)
    kit.on_cleanup(lambda ctx: cleaned.append(ctx.trace_id))
    job = job_from_dict(
        {
            "training_file": "train.jsonl",
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "grader": GRADER,
                    "tools": [{"name": "echo", "parameters": STR, "server_url": "/tools/echo"}],
                    "max_episode_steps": 6,
                },
            },
        }
    )
    grader = build_grader(job.rl.grader)
    items = [
        Item(i, ({"role": "user", "content": text},), {}, f"t:{i}")
        for i, text in enumerate(["direct", "chatty"])
    ]
    policy = ScriptedPolicy(tokenizer, reply)
    with serve_in_thread(kit.app) as url:
        settings = settings_from_job(job, policy, url, grader)
        assert settings.max_tool_calls == 1  # the grader's budget, applied by runtime
        sampler = BatchedSampler(policy, sampling_params(job, seed=3))
        groups, sampling = rollout_groups(items, 2, settings, sampler)
        assert cleaned == []  # per-trace state lives until the rollout is graded
        graded, grading = grade_rollouts(groups, grader, url)
    direct, chatty = graded
    assert [reward_of(g) for g in direct.grades] == [1.0, 1.0]
    assert [reward_of(g) for g in chatty.grades] == [-1.0, -1.0]  # over budget
    for traj in (
        chatty.trajectories
    ):  # stopped at call 2 of a budget of 1: its grade was -1 whatever came next
        assert traj.stop_reason == StopReason.MAX_TOOL_CALLS and len(traj.tool_calls) == 2
    assert set(sampling) == {"time/sampling_s", "memory/sampling_peak_mb"}
    assert set(grading) == {"time/grading_s", "memory/grading_peak_mb"}
    assert sorted(cleaned) == sorted(
        t.trace_id for g in graded for t in g.trajectories if t.tool_calls
    )
