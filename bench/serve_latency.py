"""Latency of `serve-model` on the default model, through the official openai client.

    python bench/serve_latency.py [--threads N] [--repeats R] [--max-tokens T]

Reports the median wall time of one request with n=1 and n=4 (one batched sampling call),
and of 4 concurrent n=1 requests (batched together by the server).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai
import torch

from agentrft.policy.load import load_policy
from agentrft.serve.app import create_app
from agentrft.tools.envkit import serve_in_thread

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Tell me a fact about cats."}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy("base")
    with serve_in_thread(create_app(policy, MODEL)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=600)

        def one(n: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            r = client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                n=n,
                max_tokens=args.max_tokens,
                temperature=1.0,
                seed=1,
            )
            return time.perf_counter() - t0, r.usage.completion_tokens

        async def concurrent(k: int) -> tuple[float, int]:
            async with openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="unused", timeout=600
            ) as aclient:
                t0 = time.perf_counter()
                rs = await asyncio.gather(
                    *(
                        aclient.chat.completions.create(
                            model=MODEL,
                            messages=MESSAGES,
                            max_tokens=args.max_tokens,
                            temperature=1.0,
                        )
                        for _ in range(k)
                    )
                )
                return time.perf_counter() - t0, sum(r.usage.completion_tokens for r in rs)

        one(1)  # warm-up
        for label, run in [
            ("n=1", lambda: one(1)),
            ("n=4", lambda: one(4)),
            ("4 concurrent n=1", lambda: asyncio.run(concurrent(4))),
        ]:
            results = [run() for _ in range(args.repeats)]
            secs = statistics.median(r[0] for r in results)
            tokens = statistics.median(r[1] for r in results)
            print(
                f"{label:>18}: {secs:6.2f} s median over {args.repeats}, {tokens:.0f} tokens, {tokens / secs:6.1f} tokens/s  (threads={torch.get_num_threads()})"
            )


if __name__ == "__main__":
    main()
