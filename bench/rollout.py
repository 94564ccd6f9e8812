"""Rollout benchmark: sampled tokens/s of the default model at group sizes 1, 8 and 16, and
the per-call overhead of an HTTP tool against the same tool in process (p50/p95).

    .venv/bin/python bench/rollout.py [--tokens 64] [--calls 200]

Numbers depend on the machine and on what else runs on it; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

from agentrft.job import ToolSpec
from agentrft.policy import SamplingParams
from agentrft.policy.hf import HFPolicy
from agentrft.tools import build_tools
from agentrft.tools.envkit import ToolServer, serve_in_thread
from agentrft.tools.http import new_client
from agentrft.types import ToolCall


def echo(text: str) -> str:
    return text


def sampling(tokens: int, dtype: str) -> list[tuple[int, float]]:
    policy = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype=dtype)  # weights cast once to `dtype`
    tok = policy.tokenizer
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "Write a long story about a lighthouse keeper."}], tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    policy.sample([prompt], SamplingParams(max_tokens=4), seeds=[0])  # warm up
    rows = []
    for g in (1, 8, 16):
        params = SamplingParams(temperature=1.0, max_tokens=tokens)
        t0 = time.perf_counter()
        out = policy.sample([prompt] * g, params, seeds=list(range(g)))
        dt = time.perf_counter() - t0
        rows.append((g, sum(len(c.tokens) for c in out) / dt))
    return rows


TOOL_LATENCY_S = 0.05  # the "slow" tool: a tool that waits on something (a database, a subprocess)


def slow_echo(ctx: object, text: str) -> str:
    time.sleep(TOOL_LATENCY_S)
    return text


async def tool_overhead(calls: int) -> dict[str, list[float]]:
    env = ToolServer("bench")
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    env.tool(lambda ctx, text: text, name="echo", parameters=schema)
    env.tool(slow_echo, name="slow", parameters=schema)
    with serve_in_thread(env.app) as url:
        specs = [ToolSpec(**s) for s in env.tool_specs(url)]
        tools = build_tools(specs, timeout_s=10, retries=0, backoff_s=0)
        http = tools["echo"]
        local = build_tools([ToolSpec(name="echo", function="rollout:echo")], timeout_s=10, retries=0, backoff_s=0, base_dir=str(Path(__file__).parent))["echo"]
        out: dict[str, list[float]] = {"http": [], "python": []}
        async with new_client() as client:
            for name, tool in (("http", http), ("python", local)):
                for i in range(calls + 10):
                    call = ToolCall(f"fc_{i}", f"call_{i}", "echo", '{"text": "hello"}')
                    t0 = time.perf_counter()
                    await tool(call, "trace_bench", {"k": 1}, client)
                    if i >= 10:  # skip warm-up (connection set-up)
                        out[name].append(time.perf_counter() - t0)
            # parallel calls of one turn: k concurrent HTTP calls (median of 5 turns)
            for name in ("echo", "slow"):
                for k in (1, 4, 16):
                    walls = []
                    for _ in range(5):
                        t0 = time.perf_counter()
                        await asyncio.gather(*(tools[name](ToolCall(f"fc_p{j}", f"call_p{j}", name, '{"text": "x"}'), "trace_p", {}, client) for j in range(k)))
                        walls.append(time.perf_counter() - t0)
                    out[f"parallel_{name}_{k}"] = [statistics.median(walls)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    print(f"sampling, {args.tokens} new tokens per row (tokens/s):")
    for dtype in ("fp32", "bf16"):
        for g, tps in sampling(args.tokens, dtype):
            print(f"  {dtype}  group {g:>2}: {tps:7.1f} tokens/s")
    res = asyncio.run(tool_overhead(args.calls))
    print(f"tool call overhead over {args.calls} sequential calls (ms):")
    for name in ("http", "python"):
        v = np.array(res[name]) * 1000
        print(f"  {name:>6}: p50 {np.percentile(v, 50):6.2f}  p95 {np.percentile(v, 95):6.2f}  mean {statistics.fmean(v):6.2f}")
    print(f"parallel HTTP calls in one turn (ms wall, median of 5); 'slow' waits {TOOL_LATENCY_S * 1000:.0f} ms per call:")
    for name in ("echo", "slow"):
        walls = {k: res[f"parallel_{name}_{k}"][0] * 1000 for k in (1, 4, 16)}
        print(f"  {name:>6}: " + "  ".join(f"{k:>2} calls {w:7.1f} ms ({k * walls[1] / w:4.1f}x vs one by one)" for k, w in walls.items()))


if __name__ == "__main__":
    main()
