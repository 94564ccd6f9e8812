"""From a model reference to a loaded policy: what `serve-model` (and eval, compare) take.

    base                    the default model (smollm2-135m-instruct)
    NAME | DIR | FILE.gguf  a model that `agentrft.policy.models.resolve_model` finds
    ADAPTER_DIR             a folder with adapter_config.json: a peft LoRA adapter, applied
                            to the base model it names and merged for inference
    RUN_DIR                 a training run: its latest checkpoint, which is
                            `final/merged` (or `final/adapter`) once training finished,
                            else the highest `checkpoints/step-N/{merged,adapter,model}`.
                            The run's base model is the one `RUN_DIR/run.json` names (the
                            job's `model`, portable across machines), else the adapter's own
                            `base_model_name_or_path`; a full-weights checkpoint saved
                            without a tokenizer takes the base model's.

Resolving a reference (`resolve_ref`) touches only the file system, so it is cheap and
testable; `load_policy` then loads the weights.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from agentrft.errors import ModelNotFoundError
from agentrft.policy.models import DEFAULT_MODEL

if TYPE_CHECKING:  # hf imports torch; resolving a reference should not
    from agentrft.policy.hf import HFPolicy

BASE = "base"
_STEP = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class ResolvedRef:
    kind: Literal["model", "adapter"]
    path: str  # a model name, directory or GGUF file (model), or the adapter directory
    base: str | None = (
        None  # adapter: the model it applies to; model: where its missing tokenizer comes from
    )


def _is_adapter(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest loadable checkpoint of a training run, or None when it has none."""
    candidates = [run_dir / "final" / "merged", run_dir / "final" / "adapter"]
    steps = []
    for child in (run_dir / "checkpoints").glob("step-*"):
        m = _STEP.match(child.name)
        if m and child.is_dir():
            steps.append((int(m.group(1)), child))
    for _, step in sorted(steps, reverse=True):
        candidates += [step / "merged", step / "adapter", step / "model"]
    return next((c for c in candidates if _is_model_dir(c) or _is_adapter(c)), None)


def _run_model(run_dir: Path) -> str | None:
    """The base model a training run names in run.json (the job's `model`), if any."""
    try:
        model = json.loads((run_dir / "run.json").read_text()).get("model")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return str(model) if model else None


def _adapter_base(adapter: Path, base: str | None) -> str:
    if base is not None:
        return base
    try:
        named = json.loads((adapter / "adapter_config.json").read_text()).get(
            "base_model_name_or_path"
        )
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelNotFoundError(f"{adapter}/adapter_config.json cannot be read: {exc}") from None
    if not named:
        raise ModelNotFoundError(
            f"{adapter}/adapter_config.json names no base model (base_model_name_or_path); pass the base explicitly (--base MODEL)"
        )
    return str(named)


def resolve_ref(ref: str, base: str | None = None) -> ResolvedRef:
    """What `ref` means (see the module docstring). `base` overrides the base model an
    adapter names, for adapters saved where that path no longer exists."""
    if ref == BASE:
        return ResolvedRef("model", DEFAULT_MODEL)
    path = Path(ref).expanduser()
    if not path.is_dir():
        return ResolvedRef("model", ref)  # a model name or a GGUF file: resolve_model decides
    if _is_adapter(path):
        return ResolvedRef("adapter", str(path), _adapter_base(path, base))
    if _is_model_dir(path):
        return ResolvedRef("model", str(path))
    found = latest_checkpoint(path)
    if found is None:
        raise ModelNotFoundError(
            f"{path} is not a model: no config.json (a transformers model), no adapter_config.json "
            "(a LoRA adapter) and no checkpoint of a training run (final/merged, final/adapter, "
            "checkpoints/step-N/adapter)"
        )
    run_base = base or _run_model(path)
    if _is_adapter(found):
        return ResolvedRef("adapter", str(found), _adapter_base(found, run_base))
    if _has_tokenizer(found):
        return ResolvedRef("model", str(found))
    if run_base is None:
        raise ModelNotFoundError(
            f"{found} has no tokenizer and {path}/run.json names no base model; pass the base explicitly (--base MODEL)"
        )
    return ResolvedRef("model", str(found), run_base)


def load_policy(
    ref: str, *, base: str | None = None, device: str = "auto", dtype: str = "auto"
) -> HFPolicy:
    """Load `ref` (see the module docstring) as an HFPolicy ready to sample.

    An adapter is merged into its base (`merge_and_unload`), so serving it costs the same
    as serving the base model. Raises ModelNotFoundError with what was looked for.
    """
    from agentrft.policy.hf import HFPolicy

    resolved = resolve_ref(ref, base)
    base_ref = DEFAULT_MODEL if resolved.base == BASE else resolved.base
    if resolved.kind == "model":
        if base_ref is None:
            policy = HFPolicy.load(resolved.path, device=device, dtype=dtype)
            policy.name = ref
            return policy
        # full weights saved without a tokenizer: the base model's
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentrft.policy.hf import pick_device
        from agentrft.policy.models import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(base_ref))
        model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32)
        model.to(pick_device(device)).eval()  # type: ignore[arg-type]  # transformers' stubs type .to() narrowly
        return HFPolicy.for_inference(model, tokenizer, dtype=dtype, name=ref)
    from peft import PeftModel

    assert base_ref is not None
    policy = HFPolicy.load(base_ref, device=device, dtype="fp32")  # merge in fp32, then cast
    merged = PeftModel.from_pretrained(policy.model, resolved.path).merge_and_unload()
    return HFPolicy.for_inference(merged, policy.tokenizer, dtype=dtype, name=ref)
