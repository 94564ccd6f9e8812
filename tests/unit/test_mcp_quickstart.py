"""The quickstart over MCP (`examples/quickstart/job_mcp.yaml`) against its HTTP twin
(`job.yaml`): the same env.py serves both; the MCP job's listed tool renders the same prompt,
token for token, and a scripted rollout gets the same tool output and stop. So the two jobs
train and evaluate on the same episodes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrft.job import load_job
from agentrft.policy import SamplingParams
from agentrft.rollout.group import run_groups
from agentrft.runtime import settings_from_job
from agentrft.tools.envkit import serve_in_thread
from agentrft.types import Item

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


@pytest.fixture(scope="module")
def env_url():
    spec = importlib.util.spec_from_file_location("quickstart_env_mcp", QUICKSTART / "env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with serve_in_thread(module.app) as url:
        yield url


def test_the_mcp_job_renders_and_runs_what_the_http_job_does(env_url, tokenizer):
    from tests.conftest import ScriptedPolicy

    item = Item(0, ({"role": "user", "content": "What is the capital of Kenya?"},), {}, "t:1")
    reply = '{"name": "lookup_country", "arguments": {"country": "Kenya"}}</tool_call>'
    seen = {}
    for name in ("job.yaml", "job_mcp.yaml"):
        job = load_job(QUICKSTART / name)
        policy = ScriptedPolicy(
            tokenizer, [reply, "The capital of Kenya is Nairobi."], fewshot_turns=4
        )
        settings = settings_from_job(job, policy, env_url)
        assert list(settings.tools) == ["lookup_country"]
        _, ctx = settings.renderer.initial(item)
        (group,) = run_groups([item], 1, settings, policy, SamplingParams(max_tokens=64))
        (traj,) = group.trajectories
        seen[name] = (ctx.tokens, [r.output for t in traj.turns for r in t.tool_results], traj)
    (http_prompt, http_out, http), (mcp_prompt, mcp_out, mcp) = seen.values()
    assert mcp_prompt == http_prompt  # the listed schema renders exactly as the job's own
    assert mcp_out == http_out == ["capital: Nairobi, currency: Kenyan shilling, continent: Africa"]
    assert mcp.stop_reason == http.stop_reason and mcp.discarded is None
    assert mcp.tokens == http.tokens


def test_the_environment_agentrft_launches_serves_mcp_through_its_lifespan():
    from agentrft.tools.launch import launch_environment
    from agentrft.tools.mcp import mcp_tools
    from agentrft.tools.mcp_spec import McpServer

    with launch_environment("env:app", QUICKSTART) as url:  # uvicorn in a subprocess
        tools = mcp_tools(
            [McpServer(url="/mcp")], timeout_s=5, retries=0, backoff_s=0, base_url=url
        )
    assert list(tools) == ["lookup_country"]
