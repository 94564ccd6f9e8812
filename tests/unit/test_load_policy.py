"""What a model reference resolves to: base, names, model folders, adapters, training runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.errors import ModelNotFoundError
from agentrft.policy.load import ResolvedRef, latest_checkpoint, resolve_ref
from agentrft.policy.models import DEFAULT_MODEL


def model_dir(path: Path, tokenizer: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer_config.json").write_text("{}")
    return path


def adapter_dir(path: Path, base: str | None = "base-model") -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": base, "peft_type": "LORA"})
    )
    return path


def test_names_and_model_folders(tmp_path: Path) -> None:
    assert resolve_ref("base") == ResolvedRef("model", DEFAULT_MODEL)
    assert resolve_ref("smollm2-135m-instruct") == ResolvedRef("model", "smollm2-135m-instruct")
    assert resolve_ref(str(tmp_path / "m.gguf")) == ResolvedRef("model", str(tmp_path / "m.gguf"))
    merged = model_dir(tmp_path / "merged")
    assert resolve_ref(str(merged)) == ResolvedRef("model", str(merged))


def test_adapter_uses_the_base_it_names_unless_overridden(tmp_path: Path) -> None:
    adapter = adapter_dir(tmp_path / "adapter")
    assert resolve_ref(str(adapter)) == ResolvedRef("adapter", str(adapter), "base-model")
    assert resolve_ref(str(adapter), base="base") == ResolvedRef("adapter", str(adapter), "base")
    nameless = adapter_dir(tmp_path / "nameless", base=None)
    with pytest.raises(ModelNotFoundError, match="--base"):
        resolve_ref(str(nameless))


def test_run_dir_means_its_latest_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (2, 10, 9):  # numeric order, not string order
        adapter_dir(run / "checkpoints" / f"step-{step}" / "adapter")
    (run / "checkpoints" / "step-11").mkdir()  # being written: nothing loadable yet
    (run / "checkpoints" / "notes").mkdir()
    assert latest_checkpoint(run) == run / "checkpoints" / "step-10" / "adapter"
    assert resolve_ref(str(run)) == ResolvedRef(
        "adapter", str(run / "checkpoints" / "step-10" / "adapter"), "base-model"
    )
    model_dir(run / "final" / "merged")
    assert resolve_ref(str(run)) == ResolvedRef("model", str(run / "final" / "merged"))


def test_run_json_names_the_base(tmp_path: Path) -> None:
    """The job's model in run.json is portable; the adapter's own base path may not be."""
    run = tmp_path / "run"
    adapter_dir(run / "checkpoints" / "step-4" / "adapter", base="/elsewhere/cache/SmolLM2")
    (run / "run.json").write_text(json.dumps({"model": "smollm2-135m-instruct"}))
    assert resolve_ref(str(run)).base == "smollm2-135m-instruct"
    assert resolve_ref(str(run), base="other").base == "other"


def test_full_weight_checkpoints_borrow_the_base_tokenizer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    full = model_dir(run / "checkpoints" / "step-3" / "model", tokenizer=False)
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        resolve_ref(str(run))
    (run / "run.json").write_text(json.dumps({"model": "smollm2-135m-instruct"}))
    assert resolve_ref(str(run)) == ResolvedRef("model", str(full), "smollm2-135m-instruct")
    (full / "tokenizer_config.json").write_text("{}")
    assert resolve_ref(str(run)) == ResolvedRef("model", str(full))


def test_a_folder_with_nothing_loadable_says_what_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ModelNotFoundError, match="checkpoints/step-N/adapter"):
        resolve_ref(str(tmp_path))
