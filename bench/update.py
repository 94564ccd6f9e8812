"""Update throughput as model-FLOPs utilisation, against this machine's measured matmul peak.

    .venv/bin/python bench/update.py [--groups 2] [--group-size 8] [--prompt-tokens 400] [--reply-tokens 64] [--reply-spread 0] [--only "LoRA r16 bf16"]

The batch looks like one GRPO step: `groups` prompts with `group-size` rollouts each, every
rollout a shared prompt plus its own reply (the tokens that are scored). `--reply-spread S`
gives a group's replies different lengths, from reply-tokens x (1 - S) to x (1 + S), as
agent rollouts have (one stops at its first call, another makes five). One `update_policy`
call (forward, backward, optimiser step) is timed, after one warm-up call.

MFU = 6 x parameters x tokens / time / peak, the usual convention, with two token counts:
the context tokens of every rollout (what a trainer without prefix sharing processes:
"MFU(ctx)", above 100% when sharing skips work) and the tokens agentrft actually runs
through the model, each group's prompt once plus every reply ("MFU(run)").

"HFU" counts the FLOPs the update really performs: 2 per weight per token forward; backward
2 more for activation gradients, plus 2 for weight gradients only where weights train (full
fine-tuning; with LoRA the frozen weights get none, and the adapters' own FLOPs are under 1%
and left out); the output head (the tied embedding matrix) only at the positions that
predict a scored token, since agentrft computes logits only there. Attention's own
products (QK^T and AV, roughly another 10-15% at these lengths) are not counted either way,
so both figures are lower bounds.

Each LoRA set-up is also run with prompt sharing switched off ("no-share": every rollout
runs its whole context through the model, right-padded within a micro-batch, as before the
shared-prefix update), and with the shared prompt but the replies right-padded to the
group's longest in one batch ("padded": the update before each reply ran on its own), so
the gain of each optimisation is measured side by side.
"""

from __future__ import annotations

import argparse
import time

import torch

import agentrft.train.update as update_module
from agentrft.job import Train
from agentrft.memory import peak_rss_mb, reset_peak_rss
from agentrft.policy.hf import HFPolicy
from agentrft.train.checkpoint import make_optimizer, make_trainable
from agentrft.train.loss import LossConfig
from agentrft.train.update import Scored, UpdateConfig, update_policy


def matmul_peak_tflops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e12


def padded_suffix_hidden(decoder, items, prefix, device):  # type: ignore[no-untyped-def]
    """The update's suffix path before: the shared prompt once, then every reply right-padded
    to the longest, in one batch (kept here for the side-by-side measure)."""
    from transformers import DynamicCache

    width = max(len(it.tokens) for it in items) - prefix
    ids = torch.zeros((len(items), width), dtype=torch.long)
    mask = torch.zeros((len(items), prefix + width), dtype=torch.long)
    mask[:, :prefix] = 1
    rows, cols = [], []
    for b, it in enumerate(items):
        ids[b, : len(it.tokens) - prefix] = torch.tensor(it.tokens[prefix:])
        mask[b, : len(it.tokens)] = 1
        rows += [b] * len(it.targets)
        cols += [t - 1 for t in it.targets]
    cache = DynamicCache()
    head_ids = torch.tensor([items[0].tokens[:prefix]], device=device)
    shared = decoder(input_ids=head_ids, cache=cache, use_cache=True).last_hidden_state
    cache.reorder_cache(torch.zeros(len(items), dtype=torch.long, device=device))
    positions = torch.arange(prefix, prefix + width, device=device).expand(len(items), -1)
    own = decoder(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
    ).last_hidden_state
    hidden = torch.cat([shared.expand(len(items), -1, -1), own], dim=1)
    return hidden[torch.tensor(rows), torch.tensor(cols)]


def batch(
    groups: int, size: int, prompt_tokens: int, reply_tokens: int, vocab: int, spread: float = 0.0
) -> list[Scored]:
    g = torch.Generator().manual_seed(0)
    items = []
    for k in range(groups):
        prompt = torch.randint(100, vocab, (prompt_tokens,), generator=g).tolist()
        for j in range(size):
            share = 1.0 - spread + 2 * spread * j / max(1, size - 1)
            n = max(1, round(reply_tokens * share))
            reply = torch.randint(100, vocab, (n,), generator=g).tolist()
            toks = prompt + reply
            items.append(
                Scored(
                    toks,
                    list(range(prompt_tokens, len(toks))),
                    [0.0] * n,
                    advantage=float(j % 2) - 0.5,
                    group=k,
                )
            )
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--reply-spread", type=float, default=0.0)
    ap.add_argument("--only", default="", help="run the set-ups whose label starts with this")
    args = ap.parse_args()
    peaks = {"fp32": matmul_peak_tflops(torch.float32), "bf16": matmul_peak_tflops(torch.bfloat16)}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; matmul peak fp32 {peaks['fp32'] * 1000:.0f} GFLOP/s, bf16 {peaks['bf16'] * 1000:.0f} GFLOP/s"
    )
    print(
        f"batch: {args.groups} groups x {args.group_size} rollouts, prompt {args.prompt_tokens} + reply {args.reply_tokens} tokens (spread {args.reply_spread})"
    )
    print(
        f"{'set-up':<23} {'step s':>7} {'ctx tok/s':>10} {'MFU(ctx)':>9} {'run tok/s':>10} {'MFU(run)':>9} {'HFU':>7} {'peak MiB':>9}"
    )
    shared_min, own_rows = update_module.MIN_SHARED, update_module._suffix_hidden
    for full, share, padded in (
        (False, True, False),
        (False, True, True),
        (False, False, False),
        (True, True, False),
    ):
        update_module.MIN_SHARED = shared_min if share else 10**9  # no prefix is ever long enough
        update_module._suffix_hidden = padded_suffix_hidden if padded else own_rows
        for dtype in ("fp32", "bf16"):
            mode = " no-share" if not share else " padded" if padded else ""
            label = f"{'full' if full else 'LoRA r16'} {dtype}{mode}"
            if not label.startswith(args.only):
                continue
            policy = HFPolicy.load("smollm2-135m-instruct", device="cpu", dtype="fp32")
            n_params = sum(p.numel() for p in policy.model.parameters())
            n_head = policy.model.get_output_embeddings().weight.numel()
            model = make_trainable(policy.model, Train(full_finetune=full), seed=0)
            opt = make_optimizer(model, 1e-5, 0.0)
            items = batch(
                args.groups,
                args.group_size,
                args.prompt_tokens,
                args.reply_tokens,
                policy.tokenizer.vocab_size,
                args.reply_spread,
            )
            cfg = UpdateConfig(LossConfig(), micro_batch_tokens=8192, bf16=dtype == "bf16")
            update_policy(model, opt, items, cfg)  # warm-up
            reset_peak_rss()
            t0 = time.perf_counter()
            update_policy(model, opt, items, cfg)
            dt = time.perf_counter() - t0
            ctx = sum(len(it.tokens) for it in items)
            prompts = args.groups * args.prompt_tokens
            if not share:
                run = ctx
            elif padded:  # every reply as long as its group's longest
                run = prompts + args.groups * args.group_size * max(
                    len(it.tokens) - args.prompt_tokens for it in items
                )
            else:
                run = prompts + ctx - args.groups * args.group_size * args.prompt_tokens
            peak = peaks[dtype] * 1e12
            scored = sum(len(it.targets) for it in items)
            per_weight = (
                6 if full else 4
            )  # forward 2, activation grads 2, weight grads 2 (trained weights only)
            work = per_weight * ((n_params - n_head) * run + n_head * scored)
            print(
                f"{label:<23} {dt:>7.2f} {ctx / dt:>10.0f} {6 * n_params * ctx / dt / peak:>8.1%} {run / dt:>10.0f} {6 * n_params * run / dt / peak:>8.1%} {work / dt / peak:>6.1%} {peak_rss_mb():>9.0f}"
            )
            del policy, model, opt


if __name__ == "__main__":
    main()
