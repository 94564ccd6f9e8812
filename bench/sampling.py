"""Sampling throughput: agentrft's sampler against plain `model.generate` at the same batch,
and against this machine's bound: the smaller of its memory-bandwidth and compute bounds.

    .venv/bin/python bench/sampling.py [--tokens 64] [--prompt-tokens 400] [--profile]

Rows of a batch share one prompt, as the G rollouts of a GRPO group do on their first turn.
Three agentrft set-ups are measured: the model as loaded for evaluation (`HFPolicy.load`),
the training set-up (a LoRA-wrapped model, sampled through its sampling copy), and plain
`model.generate` with the same weights and dtype. Every run samples exactly `--tokens`
tokens per row (stop tokens are ignored) so tokens/s compare like for like.

Two bounds, both measured in the same run:
- bandwidth: a decode step must read every weight once, so tokens/s <= batch x (copy
  bandwidth / weight bytes). Copy bandwidth is measured with a large tensor copy.
- compute: a token costs 2 x parameters FLOPs, so tokens/s <= matmul peak / (2 x parameters).
  The peak is measured on a model-like shape, (batch x hidden) @ (hidden x intermediate), in
  the dtype being benchmarked: the faster of a plain matmul and one on weights prepacked for
  oneDNN, so the bound is what this CPU can do, not what one kernel does.
"binds" names the smaller of the two for a decode step. Two fractions are printed:
- "decode of bound": the decode steps alone (the run's time less that of a run that samples
  one token, which is the prefill's) against that smaller bound;
- "of bound": the whole timed work, prefill included, against the time the machine needs
  for it at best: the prompt's FLOPs (prefilled once for the batch) at the matmul peak on
  the prompt's own shape, plus every decode step at the smaller bound.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from agentrft.policy import SamplingParams
from agentrft.policy.hf import HFPolicy


def copy_bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    """Bytes read + written per second by a large tensor copy (GB/s)."""
    src = torch.empty(mb * 2**20 // 4, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def parameter_count(model: torch.nn.Module) -> int:
    """Every parameter once (tied embeddings counted once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


def matmul_peak_gflops(
    rows: int, inner: int, outer: int, dtype: torch.dtype, seconds: float = 0.15
) -> float:
    """FLOP/s of (rows x inner) @ (inner x outer) in `dtype` (GFLOP/s): the best of a plain
    `linear` and, where oneDNN is built in, one on prepacked weights; the fastest of repeated
    calls, so a busy machine's pauses do not count."""
    x = torch.randn(rows, inner).to(dtype)
    w = torch.randn(outer, inner).to(dtype)
    kernels = [lambda: torch.nn.functional.linear(x, w)]
    if torch.backends.mkldnn.is_available():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            kernels.append(
                lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            )
        except RuntimeError:
            pass
    best = float("inf")
    for kernel in kernels:
        kernel()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t1 = time.perf_counter()
            kernel()
            best = min(best, time.perf_counter() - t1)
    return 2 * rows * inner * outer / best / 1e9


def plain_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from agentrft.policy.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("smollm2-135m-instruct"), dtype=torch.float32
    )
    return model.eval()


def prompt_ids(policy: HFPolicy, n_tokens: int) -> list[int]:
    tok = policy.tokenizer
    system = " ".join(
        ["You are a careful assistant that looks things up before answering."]
        * max(1, n_tokens // 12)
    )
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": system},
            {"role": "user", "content": "Tell me a long story."},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def time_sample(policy: HFPolicy, prompt: list[int], batch: int, tokens: int) -> float:
    policy.stop_token_ids = frozenset({-1})  # never stop early: exactly `tokens` per row
    t0 = time.perf_counter()
    out = policy.sample(
        [prompt] * batch,
        SamplingParams(temperature=1.0, max_tokens=tokens),
        seeds=list(range(batch)),
    )
    dt = time.perf_counter() - t0
    assert all(len(c.tokens) == tokens for c in out)
    return batch * tokens / dt


def time_generate(
    model: torch.nn.Module, prompt: list[int], batch: int, tokens: int, autocast: bool
) -> float:
    ids = torch.tensor([prompt] * batch)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.no_grad()
    with torch.no_grad(), ctx:
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
            pad_token_id=2,
        )
        return batch * tokens / (time.perf_counter() - t0)


def decode_step_parts(policy: HFPolicy, prompt: list[int], batch: int, tokens: int) -> None:
    """Where a decode step's time goes: the matmuls (projections and output head), the
    shared-prefix attention, and everything else in the step; ms per step, by wall clock."""
    from agentrft.policy import decode

    if policy.decode_step is None:
        print("(no decode step for this model: transformers' forward decodes)")
        return
    spent = {"matmuls": 0.0, "attention": 0.0, "step": 0.0}
    by_shape: dict[tuple[int, int], float] = {}  # matmul time by weight shape (out, in)
    originals = (decode._linear, decode.shared_prefix_attention, decode.LlamaDecodeStep.__call__)

    def timed(part: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                spent[part] += dt
                if part == "matmuls":  # (x, weight, packed): a prepacked weight keeps its shape
                    shape = (int(args[1].shape[0]), int(args[1].shape[1]))
                    by_shape[shape] = by_shape.get(shape, 0.0) + dt

        return run

    decode._linear = timed("matmuls", originals[0])  # type: ignore[assignment]
    decode.shared_prefix_attention = timed("attention", originals[1])  # type: ignore[assignment]
    decode.LlamaDecodeStep.__call__ = timed("step", originals[2])  # type: ignore[method-assign]
    try:
        time_sample(policy, prompt, batch, tokens)
    finally:
        decode._linear, decode.shared_prefix_attention = originals[0], originals[1]
        decode.LlamaDecodeStep.__call__ = originals[2]  # type: ignore[method-assign]
    steps = tokens - 1
    rest = spent["step"] - spent["matmuls"] - spent["attention"]
    print(
        f"decode step, ms: {spent['step'] / steps * 1e3:.1f} in all; matmuls"
        f" {spent['matmuls'] / steps * 1e3:.1f}, shared-prefix attention"
        f" {spent['attention'] / steps * 1e3:.1f}, the rest {rest / steps * 1e3:.1f}"
    )
    print(
        "matmuls by weight (out x in), ms per step: "
        + ", ".join(f"{o}x{i} {t / steps * 1e3:.1f}" for (o, i), t in sorted(by_shape.items()))
    )


def profile_sample(prompt_tokens: int, batch: int, tokens: int, dtypes: list[str]) -> None:
    """The operators one `sample` call (prefill and decode) spends its time in, by dtype,
    and a decode step's time by part."""
    from torch.profiler import ProfilerActivity, profile

    for dtype in dtypes:
        policy = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype=dtype)
        prompt = prompt_ids(policy, prompt_tokens)
        time_sample(policy, prompt, 2, 4)  # warm-up
        print(f"\n{dtype}: batch {batch}, {tokens} new tokens per row")
        decode_step_parts(policy, prompt, batch, tokens)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            rate = time_sample(policy, prompt, batch, tokens)
        print(f"under the profiler: {rate:.1f} tokens/s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="instead: where one sample call at the largest batch spends its time (torch.profiler)",
    )
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    if bad := [d for d in dtypes if d not in ("fp32", "bf16")]:
        ap.error(f"--dtypes: {', '.join(bad)} is not fp32 or bf16")
    bw = copy_bandwidth_gbs()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; copy bandwidth {bw:.1f} GB/s"
    )

    if args.profile:
        profile_sample(args.prompt_tokens, max(batches), args.tokens, dtypes)
        return

    from agentrft.job import Train
    from agentrft.train.checkpoint import make_trainable

    for dtype in dtypes:
        evalp = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype=dtype)
        prompt = prompt_ids(evalp, args.prompt_tokens)
        plain = plain_model()  # transformers as shipped: HFPolicy switches its attention
        trainp = HFPolicy.load(
            "smollm2-135m-instruct", device="cpu", dtype=dtype, for_training=True
        )
        trainp.model = make_trainable(trainp.model, Train(), seed=0)
        trainp.sync_sampler()
        n_params = parameter_count(evalp.model)
        wbytes = n_params * (2 if dtype == "bf16" else 4)
        cfg = evalp.model.config
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        prefill_peak = matmul_peak_gflops(
            len(prompt), cfg.hidden_size, cfg.intermediate_size, torch_dtype
        )
        prefill_bound_s = len(prompt) * 2 * n_params / (prefill_peak * 1e9)
        time_sample(evalp, prompt, 1, 4)  # warm-up
        print(
            f"\n{dtype}: prompt {len(prompt)} tokens, {args.tokens} new tokens per row, weights {wbytes / 2**20:.0f} MiB per decode step, {2 * n_params / 1e6:.0f} MFLOP per token"
        )
        print(
            f"prefill: {len(prompt) * 2 * n_params / 1e9:.0f} GFLOP once per batch, matmul peak on its shape {prefill_peak:.0f} GFLOP/s, so at least {prefill_bound_s:.2f}s"
        )
        print(
            f"{'batch':>5} {'generate':>10} {'agentrft':>10} {'ratio':>6} {'train set-up':>13}"
            f" {'bw bound':>9} {'peak GF/s':>10} {'fl bound':>9} {'binds':>9}"
            f" {'decode':>7} {'decode of bound':>15} {'of bound':>9}"
        )
        for b in batches:
            gen = time_generate(plain, prompt, b, args.tokens, autocast=dtype == "bf16")
            ours = time_sample(evalp, prompt, b, args.tokens)
            prefill_s = b / time_sample(evalp, prompt, b, 1)  # the prefill and its token
            decode = b * (args.tokens - 1) / (b * args.tokens / ours - prefill_s)
            tr = time_sample(trainp, prompt, b, args.tokens)
            bw_bound = b * bw * 1e9 / wbytes
            peak = matmul_peak_gflops(b, cfg.hidden_size, cfg.intermediate_size, torch_dtype)
            flop_bound = peak * 1e9 / (2 * n_params)
            bound, binds = min((bw_bound, "bandwidth"), (flop_bound, "compute"))
            whole = b * args.tokens / (prefill_bound_s + b * (args.tokens - 1) / bound)
            print(
                f"{b:>5} {gen:>10.1f} {ours:>10.1f} {ours / gen:>5.2f}x {tr:>13.1f}"
                f" {bw_bound:>9.0f} {peak:>10.0f} {flop_bound:>9.0f} {binds:>9}"
                f" {decode:>7.1f} {decode / bound:>15.1%} {ours / whole:>8.1%}"
            )
        del evalp, plain, trainp


if __name__ == "__main__":
    main()
