"""A LoRA checkpoint laid out as the trainer saves it (RUN_DIR/checkpoints/step-N/adapter)
loads through `load_policy(RUN_DIR)` and computes what the adapted model computes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrft.policy.load import load_policy

pytestmark = pytest.mark.integration


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_run_dir_loads_latest_adapter(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    base_policy = load_policy("base", dtype="fp32")  # the comparison is exact only in fp32
    ids = torch.tensor([base_policy.tokenizer.encode("The capital of France is")])
    base_logits = logits(base_policy.model, ids)
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )  # non-zero B: changes the output
    peft_model = get_peft_model(base_policy.model, config)
    try:
        run = tmp_path / "run"
        peft_model.save_pretrained(run / "checkpoints" / "step-2" / "adapter")
        expected = logits(peft_model, ids)
    finally:
        peft_model.unload()  # give the shared base model back unchanged
    assert torch.allclose(logits(base_policy.model, ids), base_logits)
    (run / "checkpoints" / "step-1" / "adapter").mkdir(parents=True)  # older and empty: ignored

    loaded = load_policy(str(run), dtype="fp32")
    got = logits(loaded.model, ids)
    assert not torch.allclose(got, base_logits, atol=1e-3)
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()
    assert loaded.name == str(run) and not hasattr(
        loaded.model, "peft_config"
    )  # merged for serving


def test_a_real_training_run_serves_its_latest_checkpoint(tmp_path: Path, base_policy: Any) -> None:
    """The trainer's own output: `final/merged` once it finished, else the newest
    `checkpoints/step-N/adapter`; both hold the same weights after a one-step run."""
    from agentrft.job import load_job
    from agentrft.train.loop import train
    from tests.integration.test_train import make_job

    run = tmp_path / "run"
    train(load_job(make_job(tmp_path, 1)), run)
    ids = torch.tensor([base_policy.tokenizer.encode("Say the word apple.")])
    final = load_policy(str(run), dtype="fp32")
    assert final.model.config.model_type == "llama"
    shutil.rmtree(run / "final")  # as if training stopped after its checkpoint
    step = load_policy(str(run), dtype="fp32")
    trained, from_adapter, base = (
        logits(final.model, ids),
        logits(step.model, ids),
        logits(base_policy.model, ids),
    )
    assert torch.allclose(trained, from_adapter, atol=1e-4), (trained - from_adapter).abs().max()
    assert (trained - base).abs().max() > 0  # the step changed the model
