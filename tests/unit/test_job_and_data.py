"""Job and dataset validation: bad input fails before any work, naming file, field/line and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.data import load_dataset
from agentrft.errors import ConfigError
from agentrft.job import job_from_dict, load_job

ROOT = Path(__file__).resolve().parents[2]
GRADER = {
    "type": "string_check",
    "name": "g",
    "input": "{{sample.output_text}}",
    "reference": "x",
    "operation": "eq",
}


def job(**over):
    base = {
        "model": "smollm2-135m-instruct",
        "training_file": "train.jsonl",
        "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
    }
    base.update(over)
    return base


def test_quickstart_job_loads_and_resolves_paths():
    j = load_job(ROOT / "examples/quickstart/job.yaml")
    assert j.training_path == ROOT / "examples/quickstart/train.jsonl"
    assert j.rl.tools[0].server_url == "/tools/lookup_country"
    assert j.rl.hyperparameters.batch_size == 4 and j.rl.hyperparameters.eval_samples == "auto"


def test_an_openai_job_json_is_valid_unchanged():
    openai_job = {
        "model": "o4-mini-2025-04-16",
        "training_file": "file-abc",
        "validation_file": "file-def",
        "seed": 42,
        "suffix": "agent",
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "tools": [
                    {
                        "name": "search",
                        "description": "d",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                        "server_url": "https://tools.example.com/search",
                        "headers": {"Authorization": "Bearer x"},
                    }
                ],
                "max_episode_steps": 10,
                "hyperparameters": {
                    "batch_size": "auto",
                    "n_epochs": 2,
                    "learning_rate_multiplier": "auto",
                    "eval_interval": 5,
                    "eval_samples": "auto",
                    "compute_multiplier": 1.5,
                    "reasoning_effort": "medium",
                },
            },
        },
    }
    j = job_from_dict(openai_job)
    assert j.rl.max_episode_steps == 10 and j.rl.hyperparameters.compute_multiplier == 1.5


def test_unknown_top_level_key_points_to_the_extension():
    with pytest.raises(ConfigError) as e:
        job_from_dict(job(lora_rank=8), source="job.yaml")
    msg = str(e.value)
    assert "job.yaml" in msg and "`lora_rank`" in msg and "agentrft:" in msg


def test_bad_nested_field_is_named_with_its_path():
    bad = job()
    bad["method"]["reinforcement"]["hyperparameters"] = {"batch_size": "lots"}
    with pytest.raises(ConfigError, match=r"method\.reinforcement\.hyperparameters\.batch_size"):
        job_from_dict(bad)
    with pytest.raises(ConfigError, match=r"agentrft\.sampling\.temprature"):
        job_from_dict(job(agentrft={"sampling": {"temprature": 1.0}}))
    with pytest.raises(
        ConfigError,
        match=r"agentrft\.sampling.*min_tokens_per_turn \(65\) is above max_tokens_per_turn \(64\)",
    ):
        job_from_dict(
            job(agentrft={"sampling": {"max_tokens_per_turn": 64, "min_tokens_per_turn": 65}})
        )


def test_tool_needs_exactly_one_backend_and_a_valid_schema():
    tools = [{"name": "t", "server_url": "http://x", "function": "m:f"}]
    bad = job()
    bad["method"]["reinforcement"]["tools"] = tools
    with pytest.raises(ConfigError, match="exactly one of `server_url`"):
        job_from_dict(bad)
    bad["method"]["reinforcement"]["tools"] = [
        {"name": "t", "server_url": "http://x", "parameters": {"type": "objekt"}}
    ]
    with pytest.raises(ConfigError, match="not a valid JSON schema"):
        job_from_dict(bad)
    bad["method"]["reinforcement"]["tools"] = [
        {"name": "t", "server_url": "http://x"},
        {"name": "t", "server_url": "http://y"},
    ]
    with pytest.raises(ConfigError, match="unique; repeated: t"):
        job_from_dict(bad)


def test_job_file_errors(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_job(p)
    with pytest.raises(ConfigError, match="job file not found"):
        load_job(tmp_path / "nope.yaml")


def write(tmp_path, lines):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_dataset_rows_and_items(tmp_path):
    p = write(
        tmp_path,
        [
            json.dumps(
                {
                    "messages": [
                        {"role": "system", "content": "s"},
                        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    ],
                    "answer": "a",
                    "prefill": "<tool_call>",
                }
            ),
            "",
        ],
    )
    (item,) = load_dataset(p)
    assert item.fields == {"answer": "a"} and item.prefill == "<tool_call>"
    assert item.messages[-1]["content"] == "hi" and item.source.endswith("d.jsonl:1")


def test_dataset_bad_lines_name_file_line_and_fix(tmp_path):
    p = write(
        tmp_path,
        [
            json.dumps({"messages": [{"role": "user", "content": "ok"}]}),
            "{not json",
            json.dumps({"prompt": "x"}),
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a"},
                    ]
                }
            ),
            json.dumps({"messages": [{"role": "wizard", "content": "q"}]}),
            json.dumps([1, 2]),
        ],
    )
    with pytest.raises(ConfigError) as e:
        load_dataset(p)
    msg = str(e.value)
    assert "5 bad line(s)" in msg
    assert "d.jsonl:2: not valid JSON" in msg
    assert 'd.jsonl:3: missing "messages"' in msg
    assert 'd.jsonl:4: the last message must have role "user"' in msg
    assert 'd.jsonl:5: messages[0] needs a "role"' in msg
    assert "d.jsonl:6: a row must be a JSON object" in msg


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"messages": 5}, '"messages" must be a list of messages, got int 5'),
        ({"messages": "hi"}, '"messages" must be a list of messages, got str "hi"'),
        ({"messages": {"role": "user"}}, '"messages" must be a list of messages, got dict'),
        ({"messages": []}, '"messages" is an empty list'),
        ({"prompt": "hi"}, 'missing "messages"'),
    ],
)
def test_a_wrong_typed_messages_is_named_as_such(tmp_path, row, says):
    with pytest.raises(ConfigError) as e:
        load_dataset(write(tmp_path, [json.dumps(row)]))
    assert f"d.jsonl:1: {says}" in str(e.value)
    assert ("missing" in str(e.value)) == ("messages" not in row)


def test_empty_and_missing_datasets(tmp_path):
    with pytest.raises(ConfigError, match="empty"):
        load_dataset(write(tmp_path, [""]))
    with pytest.raises(ConfigError, match="not found"):
        load_dataset(tmp_path / "missing.jsonl")


def test_cli_fails_before_any_work_on_a_bad_dataset(tmp_path, capsys):
    from agentrft.cli import main

    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    (tmp_path / "job.json").write_text(json.dumps(job()))
    assert main(["rollout", str(tmp_path / "job.json")]) == 2
    err = capsys.readouterr().err
    assert "train.jsonl:1" in err and '"messages" is an empty list' in err


def test_auto_hyperparameters_map_to_concrete_values_with_notes():
    from agentrft.job import resolve_hyperparameters

    j = load_job(ROOT / "examples/quickstart/job.yaml")
    hp = j.rl.hyperparameters.model_copy(
        update={
            "batch_size": "auto",
            "n_epochs": "auto",
            "compute_multiplier": 0.5,
            "eval_interval": "auto",
        }
    )
    j = j.model_copy(
        update={
            "method": j.method.model_copy(
                update={"reinforcement": j.rl.model_copy(update={"hyperparameters": hp})}
            )
        }
    )
    r = resolve_hyperparameters(j, n_train=10)
    assert (r.batch_size, r.group_size, r.steps_per_epoch, r.n_epochs, r.total_steps) == (
        4,
        4,
        2,
        5,
        10,
    )
    assert r.eval_interval == 2 and r.eval_samples == 2
    assert (
        r.notes["n_epochs"].startswith("auto -> 5")
        and "compute_multiplier 0.5" in r.notes["group_size"]
    )
    no_val = resolve_hyperparameters(j.model_copy(update={"validation_file": None}), n_train=10)
    assert (
        no_val.eval_interval == 0 and no_val.notes["eval_interval"] == "never (no validation_file)"
    )


def test_min_tokens_per_turn_reaches_the_local_sampler_and_the_endpoint():
    from agentrft.runtime import chat_settings_from_job, sampling_params

    j = job_from_dict(
        job(agentrft={"sampling": {"max_tokens_per_turn": 64, "min_tokens_per_turn": 5}})
    )
    assert sampling_params(j).min_tokens == 5
    assert chat_settings_from_job(j).sampling["min_tokens"] == 5  # vLLM's extra parameter
    assert (
        chat_settings_from_job(job_from_dict(job())).sampling["min_tokens"] is None
    )  # unset: not sent
