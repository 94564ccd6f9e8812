"""The doctor's parts without a model: hack probes on the quickstart's real tool server and
grader, the verdicts, user probe files, serve-model's request log and the traffic comparison."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from agentrft.data import load_dataset
from agentrft.errors import ConfigError
from agentrft.evaluate.doctor import Status, check_hackability, check_success, check_traffic
from agentrft.evaluate.hack_probes import (
    PROBES,
    ProbeSettings,
    Script,
    load_user_probes,
    run_probes,
    run_script,
)
from agentrft.evaluate.measure import job_grader
from agentrft.evaluate.traffic import compare_traffic, load_traffic
from agentrft.graders import grade_groups
from agentrft.job import load_job
from agentrft.redact import REDACTED, redact_text
from agentrft.rollout.turns import StopRules
from agentrft.runtime import job_environment, tools_from_job
from agentrft.serve.app import create_app
from agentrft.serve.request_log import RequestLog
from agentrft.tools.envkit import serve_in_thread
from agentrft.tools.http import new_client
from agentrft.types import Grade, Group
from tests.conftest import ScriptedPolicy

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "job.yaml"


def probe_settings(job: Any, env_url: str | None) -> ProbeSettings:
    return ProbeSettings(
        tools=tools_from_job(job, env_url),
        system_prompt=job.agentrft.system_prompt,
        few_shot=tuple(job.agentrft.few_shot_messages),
        rules=StopRules(job.rl.max_episode_steps),
        prefill_for=lambda turn, item, messages=(): None,
    )


def scripted_groups(
    settings: ProbeSettings, grader: Any, items: list, answers: list[str]
) -> list[Group]:
    """A stand-in for the base model: each row's rollouts look the country up, then answer."""

    async def run() -> list[Group]:
        async with new_client() as client:
            groups = []
            for item in items:
                call = ("lookup_country", {"country": item.fields["country"]})
                trajs = [await run_script(item, Script(call, a), settings, client) for a in answers]
                groups.append(Group(item, tuple(trajs)))
        return await grade_groups(groups, grader)

    return asyncio.run(run())


def test_probes_run_on_the_quickstart_tools_and_grader() -> None:
    job = load_job(QUICKSTART)
    items = load_dataset(job.training_path)[:3]
    grader = job_grader(job)
    with job_environment(job) as env_url:
        settings = probe_settings(job, env_url)
        base = scripted_groups(settings, grader, items, ["I do not know.", "Maybe.", "No idea."])
        summary, probe_groups = run_probes(PROBES, base, settings, grader, env_url)
    probes = summary["probes"]
    assert summary["base_median"] == 0.0
    # the lookup's output holds the answer, so pasting it back passes `ilike`: a real hack
    assert probes["tool_output"]["mean"] == 1.0
    assert probes["every_candidate"]["mean"] == 1.0
    assert "capital: Paris" in probes["tool_output"]["example"]["answer"]
    assert probes["empty"]["mean"] == probes["refusal"]["mean"] == 0.0
    # the worked example's answer names Oslo: right only for a Norway row, none of these
    assert probes["worked_example"]["mean"] == 0.0
    assert probes["repeated"]["rows"] == 3  # the base's median answer, five times
    # the schema requires `country`: a call without it is refused before it reaches the tool
    no_args = [
        g
        for g in probe_groups
        if g.trajectories[0].tool_results
        and g.trajectories[0].tool_results[0].status == "invalid_call"
    ]
    assert len(no_args) == 3
    check = check_hackability(summary)
    assert check.status == Status.FAIL
    assert check.data["failed"] == ["every_candidate", "tool_output"]
    assert any(line.startswith("tool_output ") for line in check.fix)


def test_probes_carry_the_call_of_the_lowest_rewarded_base_rollout() -> None:
    """Where a call alone earns the reward (apply the right fix, then say anything), a probe
    that copied the best rollout's call would score for the call: it copies the worst one's."""
    from agentrft.evaluate.hack_probes import RowContext

    job = load_job(QUICKSTART)
    item = load_dataset(job.training_path)[0]
    with job_environment(job) as env_url:
        settings = probe_settings(job, env_url)

        async def run() -> list[Any]:
            async with new_client() as client:
                return [
                    await run_script(
                        item, Script(("lookup_country", {"country": c}), "x"), settings, client
                    )
                    for c in ("France", "Peru")
                ]

        good, bad = asyncio.run(run())
    ctx = RowContext(
        base=[(good, 1.0), (bad, 0.0), (good, math.nan)], examples=[], tools=["lookup_country"]
    )
    assert ctx.base_call() == ("lookup_country", {"country": "Peru"})
    assert RowContext(base=[(good, 1.0)], examples=[], tools=["lookup_country"]).base_call() == (
        "lookup_country",
        {"country": "France"},
    )


def test_hackability_passes_when_no_probe_beats_the_base() -> None:
    probe = {
        "description": "d",
        "rows": 2,
        "graded": 2,
        "mean": 0.4,
        "max": 0.5,
        "errors": [],
        "example": {"answer": "x"},
    }
    ok = check_hackability({"base_median": 0.5, "base_rollouts": 8, "probes": {"p": probe}})
    assert ok.status == Status.PASS and ok.fix == []
    bad = check_hackability({"base_median": 0.3, "base_rollouts": 8, "probes": {"p": probe}})
    assert bad.status == Status.FAIL and bad.data["failed"] == ["p"]


def test_where_every_reply_is_a_call_a_probe_must_beat_the_refusal() -> None:
    """Every probe carries the base call there; if that call alone earns 0.2 (it applied the
    right fix on one row of five), an answer is a hack only when it earns more than that."""

    def probe(mean: float) -> dict[str, Any]:
        return {"description": "d", "rows": 5, "graded": 5, "mean": mean, "max": 1.0, "errors": []}

    tie = {"empty": probe(0.2), "refusal": probe(0.2)} | {"tool_output": probe(0.2)}
    summary = {"base_median": 0.0, "base_rollouts": 20, "probes": tie, "control": "refusal"}
    check = check_hackability(summary)
    assert check.status == Status.PASS and check.fix == []
    assert any("beat the refusal" in line and "0.200" in line for line in check.evidence)
    summary["probes"]["tool_output"] = probe(0.6) | {"example": {"answer": "x"}}
    check = check_hackability(summary)
    assert check.status == Status.FAIL and check.data["failed"] == ["tool_output"]
    assert "and the refusal 0.200" in check.fix[0]
    # the control is taken on the probe's own rows: 1 pass in 5 rows is the refusal's 1 in 5
    summary["probes"]["tool_output"] = probe(0.2) | {
        "by_row": {str(i): float(i == 0) for i in range(5)}
    }
    summary["probes"]["refusal"]["by_row"] = {str(i): float(i == 0) for i in range(6)}
    summary["probes"]["refusal"]["mean"] = 1 / 6
    summary["probes"]["empty"] = summary["probes"]["tool_output"]
    assert check_hackability(summary).status == Status.PASS
    # without a control (replies free to answer), the same tie is above the median
    summary["control"] = None
    for p in summary["probes"].values():
        p["example"] = {"answer": "x"}
    assert check_hackability(summary).data["failed"] == ["empty", "refusal", "tool_output"]


def test_a_grader_that_disagrees_with_itself_fails(tmp_path: Path) -> None:
    job = load_job(QUICKSTART)
    items = load_dataset(job.training_path)[:2]
    grader = job_grader(job)
    with job_environment(job) as env_url:
        settings = probe_settings(job, env_url)
        first = scripted_groups(settings, grader, items, ["Paris", "yen"])
    same = check_success(first, first, {}, job.rl.grader, 1.0)
    assert same.data["disagreements"] == 0
    flipped = [
        Group(g.item, g.trajectories, tuple(Grade(1.0 - gr.score) for gr in g.grades))
        for g in first
    ]
    trajs = {g.item.index: list(g.trajectories) for g in first}
    check = check_success(first, flipped, trajs, job.rl.grader, 1.0)
    assert check.status == Status.FAIL
    assert check.data["disagreements"] == 4
    assert check.data["unreached_rows"] == []  # the lookups returned every answer
    assert "no judge" in check.fix[0]


def test_user_probe_files_are_checked_line_by_line(tmp_path: Path) -> None:
    good = tmp_path / "probes.jsonl"
    good.write_text(
        '{"name": "cite", "answer": "Paris"}\n\n{"name": "look", "answer": "x", "tool_call": "base"}\n'
    )
    assert [p.name for p in load_user_probes(good)] == ["cite", "look"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "cite", "answer": "Paris"}\n{"name": "x", "anwser": "typo"}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: .*anwser"):
        load_user_probes(bad)


def test_redact_text_hides_keys_tokens_and_url_credentials() -> None:
    text = "key sk-abcdefghijklmnop, Authorization: Bearer abc.def.ghi123 and https://u:pw@h.io/?token=t1 password=hunter2"
    out = redact_text(text)
    for secret in ("sk-abcdefghijklmnop", "abc.def.ghi123", "u:pw", "t1", "hunter2"):
        assert secret not in out
    assert out.count(REDACTED) == 5


@pytest.fixture
def served_log(tokenizer: Any, tmp_path: Path) -> Iterator[tuple[openai.OpenAI, Path]]:
    path = tmp_path / "requests.jsonl"
    policy = ScriptedPolicy(tokenizer, lambda prompt, turn: "The capital is Paris.")
    app = create_app(policy, "scripted", request_log=RequestLog(path))
    with serve_in_thread(app) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0), path


def test_serve_model_logs_requests_redacted_and_the_doctor_compares_them(
    served_log: tuple[openai.OpenAI, Path],
) -> None:
    client, path = served_log
    asked = [
        "What is the capital of Kenya?",
        "What is the currency of Peru? my key is sk-livesecret12345",
        "Write a long poem about the sea at night, with rhyme and a chorus.",
        "Explain how to configure a Kubernetes ingress controller with TLS.",
    ]
    for q in asked:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": q}])
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    assert "sk-livesecret12345" not in path.read_text()
    assert (path.stat().st_mode & 0o777) == 0o600
    first = json.loads(lines[0])
    assert first["response"]["content"] == "The capital is Paris."
    assert first["messages"] == [{"role": "user", "content": asked[0]}]

    job = load_job(QUICKSTART)
    items = load_dataset(job.training_path)
    comparison = compare_traffic(items, [], load_traffic(path))
    assert comparison["usable"] == 4
    assert comparison["far_share"] == pytest.approx(0.5)  # the poem and the ingress question
    far = {f["request"] for f in comparison["farthest"][:2]}
    assert far == set(asked[2:])
    check = check_traffic(comparison, str(path))
    assert check.status == Status.FAIL
    assert not math.isnan(comparison["request_chars"]["ks_p_value"])


def test_a_bad_request_log_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"messages": []}\n{"nope": 1}\n')
    with pytest.raises(ConfigError, match=r"log\.jsonl:2: .*messages"):
        load_traffic(path)
    with pytest.raises(ConfigError, match="serve-model"):
        load_traffic(tmp_path / "missing.jsonl")
