"""Trainable model set-up, checkpoints, resume and the final export.

A checkpoint (`RUN_DIR/checkpoints/step-N/`) holds everything needed to continue exactly:
the adapter weights (safetensors via peft) or full weights, the optimiser state, the RNG
states, the sampler's matmul layout (timed per process, so pinned on resume) and the step
(the data cursor follows from it: each epoch's row order is a pure function of the seed).
`checkpoints/latest` names the newest complete one; a checkpoint is written to a temporary
folder and renamed, so a crash never leaves a half-written "latest".
The final export adds `final/merged/`, a plain transformers model directory.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrft.job import Train
from agentrft.policy.precision import packing_choices, pin_packing


def make_trainable(model: Any, cfg: Train, seed: int) -> Any:
    """Wrap `model` with a fresh LoRA adapter (peft), or unfreeze it for full fine-tuning.
    Master weights stay fp32; bf16 is applied by autocast in the forward passes."""
    torch.manual_seed(seed)
    if cfg.full_finetune:
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def make_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99))


@dataclass
class TrainState:
    step: int = 0  # training steps completed (each: rollouts, grades, one update)
    seed: int = 0
    # the sampler's matmul layout by dtype (policy.precision.use_packing), pinned on resume
    packed_matmuls: dict[str, bool] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> TrainState:
        return cls(**json.loads(path.read_text()))


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path, model: Any, optimizer: torch.optim.Optimizer, state: TrainState
) -> Path:
    root = run_dir / "checkpoints"
    final = root / f"step-{state.step}"
    tmp = root / f".step-{state.step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if hasattr(model, "peft_config"):
        model.save_pretrained(tmp / "adapter")  # adapter_model.safetensors + adapter_config.json
    else:
        model.save_pretrained(tmp / "model")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    state.packed_matmuls = packing_choices()
    state.save(tmp / "state.json")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").rename(root / "latest")
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> TrainState:
    """Restore weights, optimiser and RNG states in place; return the saved TrainState."""
    if (path / "adapter").is_dir():
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(
            model, load_file(str(path / "adapter" / "adapter_model.safetensors"))
        )
    else:
        from safetensors.torch import load_file

        weights: dict[str, torch.Tensor] = {}
        for f in sorted((path / "model").glob("*.safetensors")):
            weights.update(load_file(str(f)))
        model.load_state_dict(weights, strict=False)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    state = TrainState.load(path / "state.json")
    pin_packing(state.packed_matmuls)
    return state


def export_final(run_dir: Path, model: Any, tokenizer: Any) -> Path:
    """`final/adapter` (LoRA) and `final/merged`: a directory plain transformers loads."""
    out = run_dir / "final"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if hasattr(model, "peft_config"):
        model.save_pretrained(out / "adapter")
        merged = model.merge_and_unload()
    else:
        merged = model
    merged.save_pretrained(out / "merged")
    tokenizer.save_pretrained(out / "merged")
    return out / "merged"
