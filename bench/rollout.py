"""Rollout benchmark: sampled tokens/s of the default model at group sizes 1, 8 and 16, the
per-call overhead of an HTTP tool against the same tool in process (p50/p95), and multi-turn
rollouts with and without KV-cache re-use across turns (prefill tokens, tokens/s).

    .venv/bin/python bench/rollout.py [--tokens 64] [--calls 200]
    .venv/bin/python bench/rollout.py --multi-turn-only [--dtype auto] [--groups 1 8]

Numbers depend on the machine and on what else runs on it; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentrft.job import ToolSpec
from agentrft.policy import SamplingParams
from agentrft.policy.hf import HFPolicy
from agentrft.policy.precision import read_cpuinfo
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.caller_thread import run_with_caller
from agentrft.tools import build_tools
from agentrft.tools.envkit import ToolServer, serve_in_thread
from agentrft.tools.http import new_client
from agentrft.types import ToolCall


def echo(text: str) -> str:
    return text


def sampling(tokens: int, dtype: str) -> list[tuple[int, float]]:
    policy = HFPolicy.load(
        "smollm2-135m-instruct", device="cpu", dtype=dtype
    )  # weights cast once to `dtype`
    tok = policy.tokenizer
    prompt = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            tokenize=False,
            add_generation_prompt=True,
        ),
        add_special_tokens=False,
    )["input_ids"]
    policy.sample([prompt], SamplingParams(max_tokens=4), seeds=[0])  # warm up
    rows = []
    for g in (1, 8, 16):
        params = SamplingParams(temperature=1.0, max_tokens=tokens)
        t0 = time.perf_counter()
        out = policy.sample([prompt] * g, params, seeds=list(range(g)))
        dt = time.perf_counter() - t0
        rows.append((g, sum(len(c.tokens) for c in out) / dt))
    return rows


def long_prompt(tok: Any, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: a task over a listing of repository files."""
    lines = [
        f"src/module_{i // 8}/file_{i}.py: defines class Handler{i} and the function run_{i}"
        for i in range(400)
    ]
    for n in range(1, len(lines)):
        text = "Which files implement the request handlers? The repository holds:\n" + "\n".join(
            lines[:n]
        )
        ids = tok(
            tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
        if len(ids) >= tokens:
            return list(ids)
    raise ValueError("prompt too short")


def tool_turn_tokens(tok: Any) -> list[int]:
    """What follows a reply: the end of the turn, a tool output, the next assistant turn."""
    text = "<|im_end|>\n<|im_start|>user\n<tool_response>src/module_3/file_29.py\nsrc/module_7/file_61.py\nsrc/module_9/file_77.py</tool_response><|im_end|>\n<|im_start|>assistant\n"
    return list(tok(text, add_special_tokens=False)["input_ids"])


@dataclass
class MultiTurn:
    wall_s: float
    prefill_tokens: int  # prompt tokens run through the model
    reused_tokens: int  # prompt tokens served from kept KV caches
    kept_peak_mib: float
    replies: dict[tuple[int, int], tuple[int, ...]]  # (rollout, turn) -> sampled tokens

    @property
    def sampled(self) -> int:
        return sum(len(r) for r in self.replies.values())


def multi_turn(
    policy: HFPolicy, group: int, turns: int, prompt: list[int], new_tokens: int, kv_cache_mb: int
) -> MultiTurn:
    """`group` rollouts of `turns` turns each over one shared prompt, through the rollout
    engine's BatchedSampler. Every reply is exactly `new_tokens` long (min_tokens), and a
    fixed tool turn follows each, so both sides do the same work."""
    tool_turn = tool_turn_tokens(policy.tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens)
    sampler = BatchedSampler(policy, params, max_batch=group, kv_cache_mb=kv_cache_mb)
    replies: dict[tuple[int, int], tuple[int, ...]] = {}

    async def rollout(k: int) -> None:
        ctx, trace = list(prompt), f"trace_{k}"
        for turn in range(turns):
            c = await sampler.sample(ctx, new_tokens, seed=1000 * k + turn, key=trace)
            replies[k, turn] = c.tokens
            ctx += list(c.tokens) + list(tool_turn)
        sampler.release(trace)

    async def run_all() -> None:
        try:
            await asyncio.gather(*(rollout(k) for k in range(group)))
        finally:
            await sampler.aclose()

    t0 = time.perf_counter()
    run_with_caller(run_all())  # sampling on this thread, as training's rollouts do
    wall = time.perf_counter() - t0
    assert sampler.kv_cache is not None
    stats = sampler.kv_cache.stats
    return MultiTurn(
        wall, stats.prefill_tokens, stats.reused_tokens, stats.peak_bytes / 2**20, replies
    )


def multi_turn_report(
    dtype: str, groups: list[int], turns: int, prompt_tokens: int, new_tokens: int
) -> None:
    name, flags = read_cpuinfo()
    has = "unknown" if flags is None else ("yes" if "avx512_bf16" in flags else "no")
    policy = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype=dtype)
    prompt = long_prompt(policy.tokenizer, prompt_tokens)
    print(
        f"multi-turn rollouts: CPU {name or 'unknown'} (avx512_bf16: {has}), precision {policy.precision}"
    )
    print(
        f"  {turns} turns, shared prompt {len(prompt)} tokens, {new_tokens} sampled tokens and a {len(tool_turn_tokens(policy.tokenizer))}-token tool turn per turn"
    )
    multi_turn(policy, 1, 1, prompt[:64], 4, 0)  # warm up
    print(
        f"  {'group':>5} {'KV re-use':>9} {'prefill tokens':>15} {'per rollout':>12} {'re-used':>9} {'sampled':>8} {'wall s':>7} {'tokens/s':>9}  same replies (as re-prefill's)"
    )
    for g in groups:
        off = multi_turn(policy, g, turns, prompt, new_tokens, kv_cache_mb=0)
        on = multi_turn(policy, g, turns, prompt, new_tokens, kv_cache_mb=1024)
        same = sum(off.replies[key] == on.replies[key] for key in off.replies)
        for label, r in (("off", off), ("on", on)):
            print(
                f"  {g:>5} {label:>9} {r.prefill_tokens:>15} {r.prefill_tokens / g:>12.0f} {r.reused_tokens:>9} {r.sampled:>8} {r.wall_s:>7.1f} {r.sampled / r.wall_s:>9.1f}"
                + (f"  {same}/{len(on.replies)}" if label == "on" else "")
            )
        print(
            f"  {g:>5} speed-up {off.wall_s / on.wall_s:.2f}x; {off.prefill_tokens / on.prefill_tokens:.1f}x fewer prefill tokens; KV kept at most {on.kept_peak_mib:.0f} MiB"
        )


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
        local = build_tools(
            [ToolSpec(name="echo", function="rollout:echo")],
            timeout_s=10,
            retries=0,
            backoff_s=0,
            base_dir=str(Path(__file__).parent),
        )["echo"]
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
                        await asyncio.gather(
                            *(
                                tools[name](
                                    ToolCall(f"fc_p{j}", f"call_p{j}", name, '{"text": "x"}'),
                                    "trace_p",
                                    {},
                                    client,
                                )
                                for j in range(k)
                            )
                        )
                        walls.append(time.perf_counter() - t0)
                    out[f"parallel_{name}_{k}"] = [statistics.median(walls)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument(
        "--multi-turn-only", action="store_true", help="only the multi-turn KV re-use comparison"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="multi-turn precision (default auto)",
    )
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 8], help="multi-turn group sizes")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument(
        "--turn-tokens", type=int, default=32, help="sampled tokens per turn (multi-turn)"
    )
    args = ap.parse_args()
    multi_turn_report(args.dtype, args.groups, args.turns, args.prompt_tokens, args.turn_tokens)
    if args.multi_turn_only:
        return
    print(f"sampling, {args.tokens} new tokens per row (tokens/s):")
    for dtype in ("fp32", "bf16"):
        for g, tps in sampling(args.tokens, dtype):
            print(f"  {dtype}  group {g:>2}: {tps:7.1f} tokens/s")
    res = asyncio.run(tool_overhead(args.calls))
    print(f"tool call overhead over {args.calls} sequential calls (ms):")
    for name in ("http", "python"):
        v = np.array(res[name]) * 1000
        print(
            f"  {name:>6}: p50 {np.percentile(v, 50):6.2f}  p95 {np.percentile(v, 95):6.2f}  mean {statistics.fmean(v):6.2f}"
        )
    print(
        f"parallel HTTP calls in one turn (ms wall, median of 5); 'slow' waits {TOOL_LATENCY_S * 1000:.0f} ms per call:"
    )
    for name in ("echo", "slow"):
        walls = {k: res[f"parallel_{name}_{k}"][0] * 1000 for k in (1, 4, 16)}
        print(
            f"  {name:>6}: "
            + "  ".join(
                f"{k:>2} calls {w:7.1f} ms ({k * walls[1] / w:4.1f}x vs one by one)"
                for k, w in walls.items()
            )
        )


if __name__ == "__main__":
    main()
