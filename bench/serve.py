"""serve-model under concurrent clients: continuous batching against serving one by one,
and how long a request that arrives mid-decode waits for its first token.

    .venv/bin/python bench/serve.py [--dtype auto|bf16|fp32] [--clients 8] [--max-tokens 64]

The server is the real one (`create_app` on uvicorn, loopback) and the clients are the
official `openai` SDK. Every reply is exactly `--max-tokens` long (`min_tokens`, vLLM's
extension, keeps a stop token from ending it early), so each round does the same work.

1. Throughput: the same `--clients` requests one by one, then all at once, in alternating
   rounds (so that load from other processes falls on both alike); tokens/s of each and
   the ratio.
2. A late request: `--clients` streamed requests start together; once they have streamed a
   quarter of their tokens, one more request arrives. Its time to first token is set
   against the earlier batch's total time. The same again with the whole-reply batching
   serve-model used before (`continuous=False`), the late request sent as long after the
   start: there it waits for the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import openai
import torch

from agentrft.policy.load import load_policy
from agentrft.policy.precision import read_cpuinfo
from agentrft.serve.app import create_app
from agentrft.tools.envkit import serve_in_thread

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "Tell me a fact about cats.",
    "Why is the sky blue?",
    "Write a haiku about rain.",
    "What is the capital of France?",
    "Explain what a compiler does.",
    "Give me a tip for learning to cook.",
    "What makes a good friend?",
    "Describe the ocean in one sentence.",
    "How do airplanes fly?",
    "Name three uses of a paperclip.",
]


def request(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
        "temperature": 1.0,
        "seed": i,
        "max_tokens": max_tokens,
        "extra_body": {"min_tokens": max_tokens},
    }


async def one(c: openai.AsyncOpenAI, i: int, max_tokens: int) -> int:
    r = await c.chat.completions.create(**request(i, max_tokens))
    assert r.usage is not None
    return r.usage.completion_tokens


async def one_by_one(c: openai.AsyncOpenAI, n: int, max_tokens: int) -> tuple[float, int]:
    t0, tokens = time.perf_counter(), 0
    for i in range(n):
        tokens += await one(c, i, max_tokens)
    return time.perf_counter() - t0, tokens


async def together(c: openai.AsyncOpenAI, n: int, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(c, i, max_tokens) for i in range(n)))
    return time.perf_counter() - t0, sum(tokens)


async def streamed(
    c: openai.AsyncOpenAI, i: int, max_tokens: int, on_piece: Any = None
) -> tuple[float, float]:
    """(time to first content, time to the end) of one streamed request."""
    t0 = time.perf_counter()
    first = None
    stream = await c.chat.completions.create(stream=True, **request(i, max_tokens))
    async for chunk in stream:
        if any(ch.delta.content for ch in chunk.choices):
            first = time.perf_counter() - t0 if first is None else first
            if on_piece is not None:
                on_piece()
    assert first is not None
    return first, time.perf_counter() - t0


async def late_arrival(
    c: openai.AsyncOpenAI, n: int, max_tokens: int, after_s: float | None = None
) -> dict[str, float]:
    """`n` streamed requests start together; one more arrives `after_s` later, or (None)
    once they have streamed a quarter of their tokens."""
    t0 = time.perf_counter()
    pieces, quarter = 0, asyncio.Event()

    def count() -> None:
        nonlocal pieces
        pieces += 1
        if pieces >= n * max_tokens // 4:
            quarter.set()

    batch = asyncio.gather(*(streamed(c, i, max_tokens, count) for i in range(n)))

    async def late() -> tuple[float, float, float]:
        if after_s is None:
            await quarter.wait()
        else:
            await asyncio.sleep(after_s)
        sent = time.perf_counter() - t0
        first, end = await streamed(c, n, max_tokens)
        return sent, first, end

    (sent, first, end), earlier = await asyncio.gather(late(), batch)
    batch_end = max(e for _, e in earlier)
    return {
        "batch_s": batch_end,
        "late_sent_s": sent,
        "late_ttft_s": first,
        "batch_left_s": batch_end - sent,
        "late_total_s": end,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu, _ = read_cpuinfo()
    policy = load_policy("base", dtype=args.dtype)
    print(f"CPU: {cpu or 'unknown'} ({os.cpu_count()} logical CPUs), torch {torch.__version__}")
    print(
        f"device {policy.device}, {torch.get_num_threads()} threads, precision {policy.precision}"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    n, T = args.clients, args.max_tokens

    async def session(url: str, work: Any) -> Any:
        async with openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=1800
        ) as c:
            await one(c, 0, 4)  # warm-up
            return await work(c)

    with serve_in_thread(create_app(policy, MODEL, max_batch=32)) as url:
        print(f"\n1. throughput: {n} requests of {T} tokens each, one by one vs all at once")
        seq_rates, conc_rates = [], []

        async def throughput(c: openai.AsyncOpenAI) -> None:
            await together(c, n, 8)  # warm-up at this batch size
            for r in range(args.rounds):
                s, st = await one_by_one(c, n, T)
                k, kt = await together(c, n, T)
                seq_rates.append(st / s)
                conc_rates.append(kt / k)
                print(
                    f"   round {r + 1}: one by one {st} tokens in {s:6.1f} s = {st / s:6.1f} tokens/s;"
                    f" {n} at once {kt} tokens in {k:6.1f} s = {kt / k:6.1f} tokens/s;"
                    f" ratio {(kt / k) / (st / s):.2f}x"
                )

        asyncio.run(session(url, throughput))
        seq, conc = statistics.median(seq_rates), statistics.median(conc_rates)
        ratios = sorted(k / s for s, k in zip(seq_rates, conc_rates, strict=True))
        print(
            f"   median: one by one {seq:.1f} tokens/s, {n} at once {conc:.1f} tokens/s:"
            f" {conc / seq:.2f}x (round ratios {ratios[0]:.2f}x .. {ratios[-1]:.2f}x)"
        )
        print(f"\n2. a late request arrives while {n} others decode ({T} tokens each)")
        cont = asyncio.run(session(url, lambda c: late_arrival(c, n, T)))
    # whole replies stream nothing until the end: the late request comes as long after the start
    with serve_in_thread(create_app(policy, MODEL, max_batch=32, continuous=False)) as url:
        whole = asyncio.run(session(url, lambda c: late_arrival(c, n, T, cont["late_sent_s"])))
    for label, m in [("continuous batching", cont), ("whole-reply batching", whole)]:
        print(
            f"   {label:>20}: late request's first token {m['late_ttft_s']:5.2f} s after it was sent;"
            f" earlier batch {m['batch_s']:5.1f} s in all, {m['batch_left_s']:5.1f} s of it left"
            f" when the late one was sent; late reply done in {m['late_total_s']:5.1f} s"
        )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
