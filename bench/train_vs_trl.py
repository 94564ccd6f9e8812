"""agentrft vs TRL's GRPOTrainer, side by side on the same work, in one run.

    make bench-venv                       # .venv plus trl==1.16.0 (pinned in constraints.txt)
    .venv/bin/python bench/train_vs_trl.py [--tasks single,multi] [--steps 3] [--warmup 1]

What both sides get: the default model (SmolLM2-135M-Instruct, the converted safetensors
directory), the same rows in the same order (identical prompt token ids: checked and
printed), the same group size, rows per step, max new tokens, temperature (1.0, no top-k /
top-p), LoRA (r=16, alpha=32, dropout 0, q,k,v,o,gate,up,down), learning rate, AdamW betas,
grad-norm clip, one optimisation pass per batch (no old log-probs), no KL, and the same
reward (agentrft's fuzzy_match: rapidfuzz WRatio of the final reply against the row's answer).

- single: one-word questions, one reply per rollout; run in fp32 and in bf16 (agentrft:
  autocast over fp32 master weights; TRL: `bf16=True, use_cpu=True`, whose effect is probed
  and printed).
- multi: the employee-directory lookup with an in-process Python tool and up to 3 replies per
  rollout (TRL: `tools=[...]`, max_tool_calling_iterations=2); both sides render tools with
  TRL's ChatML template `qwen2_5.jinja`. bf16 only, to keep the run short.

With `--fixed-length` (single-turn only) every reply is exactly `--max-new-tokens` long on both
sides (agentrft: `min_tokens_per_turn`; TRL: `generation_kwargs={"min_new_tokens": ...}`): no
stop token can end a reply early, so both sides sample and train on the same number of tokens,
and the step ratio no longer depends on how long each side's random replies happened to be.

Each (task, dtype, side) runs in its own process, one after the other; the first `--warmup`
steps are not measured. Reported per step (mean of the measured steps): sampling, reward,
update, other, total, sampled tokens and tokens/s, rollouts entering the update, and
TRL/agentrft ratios. Numbers depend on the machine and on what else runs on it: run it on a
quiet machine. The default full run is estimated at about 15 minutes on 2 quiet cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIDES = ("agentrft", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="single,multi", help="comma-separated: single, multi")
    ap.add_argument(
        "--dtypes",
        default="fp32,bf16",
        help="dtypes of the single-turn task (multi runs bf16 only)",
    )
    ap.add_argument("--rows", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    ap.add_argument(
        "--max-new-tokens", type=int, default=64, help="single-turn: new tokens per reply"
    )
    ap.add_argument(
        "--multi-rows", type=int, default=2, help="prompts per step of the multi-turn task"
    )
    ap.add_argument(
        "--multi-max-tokens",
        type=int,
        default=96,
        help="multi-turn: sampled-token budget (TRL: max_completion_length)",
    )
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument(
        "--multi-steps", type=int, default=2, help="measured steps of the multi-turn task"
    )
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    ap.add_argument(
        "--fixed-length",
        action="store_true",
        help="single-turn: every reply exactly --max-new-tokens long on both sides (no stop token before), so both sample and train on the same number of tokens",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in each run (default: torch's choice)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    # internal: one side of one comparison in this process
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--task", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def config_for(args: argparse.Namespace, task: str) -> Any:
    from vs_trl_runners import Config

    if task == "multi":
        return Config(
            args.multi_rows, args.group, args.multi_max_tokens, args.multi_steps, args.warmup
        )
    return Config(
        args.rows,
        args.group,
        args.max_new_tokens,
        args.steps,
        args.warmup,
        fixed_length=args.fixed_length,
    )


def worker(args: argparse.Namespace) -> None:
    """One side, one task, one dtype; writes result.json into --work."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from vs_trl_runners import run_agentrft, run_trl
    from vs_trl_tasks import make_task, tools_model_dir

    from agentrft.policy.models import resolve_model

    cfg = config_for(args, args.task)
    task = make_task(args.task, cfg.rows * cfg.total_steps)
    model_dir = resolve_model("smollm2-135m-instruct")
    if task.tools:
        model_dir = tools_model_dir(model_dir, args.work.parent / "model-with-tools-template")
    run = run_agentrft if args.worker == "agentrft" else run_trl
    result = run(task, cfg, args.dtype, model_dir, args.work)
    result["torch_threads"] = torch.get_num_threads()
    (args.work / "result.json").write_text(json.dumps(result))


# -- the parent: run every comparison, then print the tables -----------------------------


def machine() -> dict[str, Any]:
    import torch

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(
        (
            int(ln.split()[1]) / 2**20
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.startswith("MemTotal")
        ),
        0.0,
    )
    import transformers
    import trl

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "load_avg_start": os.getloadavg(),
    }


def run_side(
    args: argparse.Namespace, side: str, task: str, dtype: str, root: Path
) -> dict[str, Any] | None:
    work = root / f"{task}-{dtype}-{side}"
    work.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        side,
        "--task",
        task,
        "--dtype",
        dtype,
        "--work",
        str(work),
    ]
    for flag in (
        "rows",
        "group",
        "max_new_tokens",
        "multi_rows",
        "multi_max_tokens",
        "steps",
        "multi_steps",
        "warmup",
        "threads",
    ):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if args.fixed_length:
        cmd.append("--fixed-length")
    t0 = time.perf_counter()
    with (work / "log.txt").open("w") as log:
        proc = subprocess.run(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
        )
    wall = time.perf_counter() - t0
    load = os.getloadavg()[0]
    if proc.returncode != 0:
        tail = (work / "log.txt").read_text().splitlines()[-25:]
        print(
            f"  {side:8s} {task}/{dtype}: FAILED (exit {proc.returncode}) after {wall:.0f}s; log {work / 'log.txt'}:\n    "
            + "\n    ".join(tail),
            flush=True,
        )
        return None
    if not args.keep:  # the merged model and checkpoints agentrft exports at the end (~0.5 GB)
        for heavy in ("run/final", "run/checkpoints", "trl"):
            shutil.rmtree(work / heavy, ignore_errors=True)
    result = json.loads((work / "result.json").read_text())
    result["wall_s"], result["load_avg_end"] = wall, load
    print(f"  {side:8s} {task}/{dtype}: {wall:.0f}s wall (load average {load:.2f})", flush=True)
    return result


def mean(result: dict[str, Any], key: str, warmup: int) -> float:
    values = [s[key] for s in result["steps"][warmup:] if s.get(key) is not None]
    return statistics.fmean(values) if values else float("nan")


ROWS = [  # label, key, format
    ("sampling (s)", "sampling_s", "{:.2f}"),
    ("reward (s)", "reward_s", "{:.3f}"),
    ("update (s)", "update_s", "{:.2f}"),
    ("other (s)", "other_s", "{:.2f}"),
    ("**step total (s)**", "step_s", "**{:.2f}**"),
    ("sampled tokens", "sampled_tokens", "{:.0f}"),
    ("tokens generated (incl. truncated)", "generated_tokens", "{:.0f}"),
    ("sampling tokens/s (kept)", "tokens_per_s", "{:.0f}"),
    ("rollouts in the update", "update_rows", "{:.1f}"),
    ("context tokens of those rollouts", "update_context_tokens", "{:.0f}"),
    ("update ms per 1k context tokens", "update_ms_per_1k", "{:.0f}"),
    ("model replies", "replies", "{:.1f}"),
    ("tool calls answered", "tool_calls", "{:.1f}"),
    ("reward mean", "reward_mean", "{:.3f}"),
]
HIGHER_IS_BETTER = {"tokens_per_s"}


def summary(result: dict[str, Any], warmup: int) -> dict[str, float]:
    out = {
        key: mean(result, key, warmup)
        for _, key, _ in ROWS
        if key not in ("tokens_per_s", "update_ms_per_1k")
    }
    out["tokens_per_s"] = (
        out["sampled_tokens"] / out["sampling_s"] if out["sampling_s"] else float("nan")
    )
    tokens = out["update_context_tokens"]
    out["update_ms_per_1k"] = 1e6 * out["update_s"] / tokens if tokens else float("nan")
    return out


def table(a: dict[str, Any], t: dict[str, Any], warmup: int) -> str:
    sa, st = summary(a, warmup), summary(t, warmup)
    lines = ["| per step (mean) | agentrft | TRL | TRL / agentrft |", "|---|---:|---:|---:|"]
    for label, key, fmt in ROWS:
        x, y = sa[key], st[key]
        ratio = ""
        if (
            key
            in ("sampling_s", "reward_s", "update_s", "step_s", "tokens_per_s", "update_ms_per_1k")
            and x > 0
            and y > 0
        ):
            r = (x / y) if key in HIGHER_IS_BETTER else (y / x)
            ratio = f"{r:.2f}x" if key != "step_s" else f"**{r:.2f}x**"
        cells = [fmt.format(v) if math.isfinite(v) else "-" for v in (x, y)]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def prompt_check(a: dict[str, Any], t: dict[str, Any]) -> str:
    ours, theirs = a["prompt_ids"], t["prompt_ids"]  # [step][prompt] -> ids
    pairs = [
        (x, y) for sa, st in zip(ours, theirs, strict=False) for x, y in zip(sa, st, strict=False)
    ]
    same = sum(x == y for x, y in pairs)
    lengths = sorted({len(x) for x, _ in pairs})
    verdict = (
        "identical" if pairs and same == len(pairs) and len(ours) == len(theirs) else "DIFFERENT"
    )
    return (
        f"prompt token ids: {verdict} on both sides ({same}/{len(pairs)} prompts over {len(theirs)} steps, {lengths[0]}-{lengths[-1]} tokens)"
        if pairs
        else "prompt token ids: none captured"
    )


def report(
    args: argparse.Namespace,
    results: dict[tuple[str, str, str], dict[str, Any] | None],
    info: dict[str, Any],
) -> None:
    print(
        f"\n## Machine\n\n{info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM; torch {info['torch']}, transformers {info['transformers']}, trl {info['trl']}"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in info['load_avg_start'])}")
    for task, dtype in dict.fromkeys((k[0], k[1]) for k in results):  # in the order they ran
        a, t = results.get((task, dtype, "agentrft")), results.get((task, dtype, "trl"))
        cfg = config_for(args, task)
        what = "single-turn" if task == "single" else "multi-turn tool task"
        budget = (
            f"<= {cfg.max_new_tokens} new tokens"
            if task == "single"
            else f"<= 3 replies, {cfg.max_new_tokens}-token budget"
        )
        print(
            f"\n## {what}, {dtype}: {cfg.rows} prompts x {cfg.group} rollouts per step, {budget}, {cfg.steps} measured steps after {cfg.warmup} warm-up\n"
        )
        if a is None or t is None:
            print(
                "not compared: "
                + ", ".join(s for s, r in (("agentrft", a), ("TRL", t)) if r is None)
                + " failed (see its log above)"
            )
            continue
        print(table(a, t, cfg.warmup))
        print(f"\n{prompt_check(a, t)}")
        print(
            f"torch threads: agentrft {a['torch_threads']}, TRL {t['torch_threads']}; wall per run (load, model, all steps): agentrft {a['wall_s']:.0f}s, TRL {t['wall_s']:.0f}s; load average after: {a['load_avg_end']:.2f} / {t['load_avg_end']:.2f}"
        )
        p = t["precision"]
        print(
            f"TRL precision: accelerate mixed_precision={p['mixed_precision']}, native autocast={p['native_amp']}, LoRA weights {p['master_weights']}, base weights {p['base_weights']}, "
            f"Linear outputs by phase {json.dumps(p['linear_output_dtype'], sort_keys=True)}"
        )
        if task == "multi":
            print(
                f"TRL swapped in a training chat template: {t['chat_template_swapped']}; agentrft rendered tools natively: {a['native_tools']}"
            )
            for side, r in (("agentrft", a), ("TRL", t)):
                turns = r["example_tool_rollout"]
                print(
                    f"a {side} rollout that called the tool:"
                    + ("".join(f"\n    {line}" for line in turns) if turns else " none in this run")
                )


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(HERE))  # vs_trl_tasks, vs_trl_runners
    if args.worker:
        worker(args)
        return
    info = machine()
    root = Path(tempfile.mkdtemp(prefix="train_vs_trl."))
    plan = [
        (task, dtype)
        for task in args.tasks.split(",")
        for dtype in (args.dtypes.split(",") if task == "single" else ["bf16"])
    ]
    print(f"runs in {root}", flush=True)
    results: dict[tuple[str, str, str], dict[str, Any] | None] = {}
    for task, dtype in plan:
        for side in SIDES:
            results[(task, dtype, side)] = run_side(args, side, task, dtype, root)
    report(args, results, info)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "runs": {"/".join(k): v for k, v in results.items()},
                },
                indent=1,
            )
        )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\nrun directories kept in {root}")


if __name__ == "__main__":
    main()
