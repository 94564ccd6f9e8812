"""Training on the real 135M model: two steps change the LoRA weights and write checkpoints;
a run killed right after a checkpoint and resumed ends with the same weights as an
uninterrupted run; the final merged model loads with plain transformers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrft.job import load_job
from agentrft.train.loop import train

pytestmark = pytest.mark.integration

ROWS = [
    ("apple", "Say the word apple."),
    ("river", "Say the word river."),
    ("green", "Say the word green."),
    ("seven", "Say the word seven."),
]


def make_job(tmp: Path, steps: int, **train_over) -> Path:
    (tmp / "train.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}], "answer": a}) + "\n"
            for a, q in ROWS
        )
    )
    job = {
        "model": "smollm2-135m-instruct",
        "training_file": "train.jsonl",
        "seed": 5,
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "text_similarity",
                    "name": "sim",
                    "input": "{{sample.output_text}}",
                    "reference": "{{item.answer}}",
                    "evaluation_metric": "fuzzy_match",
                },
                "hyperparameters": {"batch_size": 2, "n_epochs": 2, "learning_rate_multiplier": 5},
            },
        },
        "agentrft": {
            "group_size": 4,
            "dtype": "fp32",
            "sampling": {"temperature": 1.0, "max_tokens_per_turn": 6, "max_tokens_per_episode": 6},
            "train": {"checkpoint_interval": 1, "max_steps": steps, **train_over},
        },
    }
    path = tmp / "job.json"
    path.write_text(json.dumps(job))
    return path


def adapter(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))


def test_two_steps_change_the_lora_weights_and_write_checkpoints(tmp_path):
    run = tmp_path / "run"
    train(load_job(make_job(tmp_path, 2)), run)
    first, second = adapter(run / "checkpoints/step-1"), adapter(run / "checkpoints/step-2")
    assert (run / "checkpoints/latest").read_text() == "step-2"
    lora_b = [k for k in second if "lora_B" in k]
    assert lora_b and any(second[k].abs().max() > 0 for k in lora_b)  # B starts at zero
    assert any(not torch.equal(first[k], second[k]) for k in second)
    for name in ("optimizer.pt", "rng.pt", "state.json"):
        assert (run / "checkpoints/step-2" / name).is_file()
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for key in (
        "reward/mean",
        "train/entropy",
        "train/clip_fraction",
        "time/sampling_s",
        "time/grading_s",
        "rollouts/tool_calls/p95",
        "groups/zero_signal",
    ):
        assert key in metrics[-1], key
    assert any(m.get("train/tokens", 0) > 0 for m in metrics)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "rollouts/step-2.jsonl").read_text().count("trace_") >= 8
    # the merged export loads with plain transformers and carries the update
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(run / "final/merged")
    assert merged.config.model_type == "llama"


def test_resume_after_a_kill_matches_an_uninterrupted_run(tmp_path):
    """Every run is its own process, as a user's are, so nothing in this one (the suite's
    earlier tests) can differ between them. Both first runs sample on prepacked weights, set
    by hand; the resume is told plain weights, and must keep the layout its checkpoint
    recorded (a timed choice can differ between two processes on a busy machine)."""
    from agentrft.policy.precision import PACKING_ENV

    log = tmp_path / "train.log"

    def cli_train(*args: str, packed: str) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "agentrft.cli", "train", *args],
                env={**os.environ, "PYTHONUNBUFFERED": "1", PACKING_ENV: packed},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def finish(proc: subprocess.Popen[bytes]) -> None:
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run_a, run_b = tmp_path / "a/run", tmp_path / "b/run"
    finish(cli_train(str(make_job(tmp_path / "a", 3)), "--out", str(run_a), packed="on"))
    proc = cli_train(str(make_job(tmp_path / "b", 3)), "--out", str(run_b), packed="on")
    latest = run_b / "checkpoints/latest"
    try:
        deadline = time.monotonic() + 600
        while not latest.exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # right after a checkpoint
    finally:
        proc.kill()
        proc.wait()
    killed_at = latest.read_text()
    assert killed_at in ("step-1", "step-2"), killed_at
    assert not (run_b / "final").exists()
    finish(cli_train("--resume", str(run_b), packed="off"))
    a, b = adapter(run_a / "checkpoints/step-3"), adapter(run_b / "checkpoints/step-3")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    for run in (run_a, run_b):  # the resume kept the recorded layout, not the one it was told
        state = json.loads((run / "checkpoints/step-3/state.json").read_text())
        assert state["packed_matmuls"] == {"float32": True}
    steps = [json.loads(x)["step"] for x in (run_b / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # nothing logged twice or lost across the kill
