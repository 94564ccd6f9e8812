"""agentrft.runtime (rollout and sampling settings) and agentrft.train.settings (update and
loss settings): one job means the same run everywhere."""

from __future__ import annotations

import pytest

from agentrft.graders import build_grader
from agentrft.job import job_from_dict
from agentrft.runtime import chat_settings_from_job, tool_call_cap
from agentrft.train.settings import loss_config, normalize_std, update_config

INNER = {
    "type": "string_check",
    "name": "g",
    "input": "{{sample.output_text}}",
    "reference": "x",
    "operation": "eq",
}


def budget(n: int) -> dict:
    return {"type": "tool_budget", "name": "budget", "max_tool_calls": n, "grader": INNER}


def job(grader: dict | None = None, **ext):
    return job_from_dict(
        {
            "training_file": "train.jsonl",
            "method": {"type": "reinforcement", "reinforcement": {"grader": grader or INNER}},
            "agentrft": ext,
        }
    )


@pytest.mark.parametrize(
    ("job_cap", "grader_budget", "expected"),
    [
        (None, None, None),  # no cap anywhere
        (5, None, 5),  # the job's max_tool_calls
        (None, 2, 2),  # a tool_budget grader: call 3 would score -1 whatever follows
        (5, 2, 2),  # the smaller of the two
        (1, 2, 1),
    ],
)
def test_the_tool_call_cap_is_the_smaller_of_the_job_and_the_grader_budget(
    job_cap, grader_budget, expected
):
    grader_json = budget(grader_budget) if grader_budget is not None else None
    j = job(grader_json, **({"max_tool_calls": job_cap} if job_cap is not None else {}))
    grader = build_grader(j.rl.grader, check_resources=False)
    assert tool_call_cap(j, grader) == expected
    assert chat_settings_from_job(j, grader=grader).max_tool_calls == expected
    assert tool_call_cap(j) == job_cap  # without a grader, only the job's own cap


def test_a_budget_nested_in_multi_caps_calls_too():
    multi = {"type": "multi", "graders": {"b": budget(3), "c": INNER}, "calculate_output": "b + c"}
    j = job(multi)
    assert tool_call_cap(j, build_grader(j.rl.grader, check_resources=False)) == 3


def test_dapo_gets_the_clip_higher_default_and_dr_grpo_drops_the_std():
    assert (
        loss_config(job(train={"loss": "dapo"})).clip_low,
        loss_config(job(train={"loss": "dapo"})).clip_high,
    ) == (0.2, 0.28)
    assert loss_config(job(train={"loss": "grpo"})).clip_high == 0.2  # symmetric unless set
    assert loss_config(job(train={"loss": "dapo", "clip_high": 0.3})).clip_high == 0.3  # as given
    assert normalize_std(job(train={"loss": "grpo"})) and not normalize_std(
        job(train={"loss": "dr_grpo"})
    )


def test_update_config_follows_the_job():
    cfg = update_config(
        job(sampling={"temperature": 0.0, "max_tokens_per_episode": 300}, train={"ppo_epochs": 2}),
        bf16=True,
    )
    assert cfg.temperature == 1.0  # greedy sampling scores log-probs at temperature 1
    assert (cfg.ppo_epochs, cfg.max_tokens_per_episode, cfg.bf16) == (2, 300, True)
    assert cfg.loss.variant == "grpo"


def test_chat_settings_take_an_eval_temperature():
    j = job(sampling={"temperature": 0.7})
    assert chat_settings_from_job(j).sampling["temperature"] == 0.7
    assert chat_settings_from_job(j, temperature=0.0).sampling["temperature"] == 0.0
