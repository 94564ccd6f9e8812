"""One side of the comparison in one process: agentrft's `train()` or TRL's `GRPOTrainer`,
on a task of `vs_trl_tasks.py`, returning per-step phase times and token counts.

agentrft's phases come from its own `metrics.jsonl` (`time/sampling_s`, `time/grading_s`,
`time/update_s`, `time/step_s`). TRL has no such split, so its methods are timed on the
trainer instance: `_generate` (tokenize, sample, parse, tool loop), `_calculate_rewards`,
`_generate_and_score_completions` (both, plus advantages), and one optimiser step from the
`on_step_begin` to the `on_step_end` callback (generate-and-score, loss, backward, clipping,
optimiser). TRL's update = step - generate-and-score.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vs_trl_tasks import Task, final_text, fuzzy

from agentrft.job import LORA_TARGET_MODULES


@dataclass(frozen=True)
class Config:
    rows: int  # prompts per step
    group: int  # rollouts per prompt
    max_new_tokens: int  # per reply and per rollout; TRL: the whole completion (see RESULTS.md)
    steps: int  # measured steps
    warmup: int  # steps run first and not measured
    fixed_length: bool = (
        False  # every reply exactly max_new_tokens (no stop before): equal work on both sides
    )
    temperature: float = 1.0
    learning_rate: float = 2e-4
    seed: int = 0
    lora_r: int = 16
    lora_alpha: int = 32
    targets: tuple[str, ...] = LORA_TARGET_MODULES  # agentrft's default on both sides

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


def agentrft_job(task: Task, cfg: Config, dtype: str, model_dir: Path) -> dict[str, Any]:
    return {
        "model": str(model_dir),
        "training_file": "train.jsonl",
        "seed": cfg.seed,
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "text_similarity",
                    "name": "fuzzy",
                    "input": "{{sample.output_text}}",
                    "reference": "{{item.answer}}",
                    "evaluation_metric": "fuzzy_match",
                },
                "tools": task.tool_specs(),
                "max_episode_steps": task.max_turns,
                "hyperparameters": {"batch_size": cfg.rows, "n_epochs": 1},
            },
        },
        "agentrft": {
            "system_prompt": task.system_prompt,
            "few_shot_messages": task.few_shot,
            "group_size": cfg.group,
            "device": "cpu",
            "dtype": dtype,
            "sampling": {
                "temperature": cfg.temperature,
                "top_p": 1.0,
                "max_tokens_per_turn": cfg.max_new_tokens,
                "max_tokens_per_episode": cfg.max_new_tokens,
                "min_tokens_per_turn": cfg.max_new_tokens if cfg.fixed_length else 0,
            },
            "train": {
                "learning_rate": cfg.learning_rate,
                "loss": "grpo",
                "kl_coef": 0.0,
                "ppo_epochs": 1,
                "max_grad_norm": 1.0,
                "checkpoint_interval": 10_000,
                "max_steps": cfg.total_steps,
                "lora": {
                    "rank": cfg.lora_r,
                    "alpha": cfg.lora_alpha,
                    "dropout": 0.0,
                    "target_modules": list(cfg.targets),
                },
            },
        },
    }


def load_job(task: Task, cfg: Config, dtype: str, model_dir: Path, work: Path) -> Any:
    from agentrft.job import job_from_dict

    work.mkdir(parents=True, exist_ok=True)
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task.rows))
    return job_from_dict(
        agentrft_job(task, cfg, dtype, model_dir), source="bench/train_vs_trl", base_dir=work
    )


def step_rows(job: Any, task: Task) -> list[list[int]]:
    """Row indices of each step, in agentrft's order (TRL is fed the same order, unshuffled)."""
    from agentrft.data import load_dataset
    from agentrft.job import resolve_hyperparameters
    from agentrft.train.step import batch_rows

    items = load_dataset(job.training_path)
    hp = resolve_hyperparameters(job, len(items))
    return [[it.index for it in batch_rows(items, hp, s, job.seed)] for s in range(hp.total_steps)]


# -- agentrft -------------------------------------------------------------------------------


def run_agentrft(
    task: Task, cfg: Config, dtype: str, model_dir: Path, work: Path
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from agentrft.data import load_dataset
    from agentrft.rollout.context import ChatRenderer
    from agentrft.rollout.records import read_jsonl
    from agentrft.train.loop import train
    from agentrft.train.observe import read_metrics

    job = load_job(task, cfg, dtype, model_dir, work)
    order = step_rows(job, task)
    run = train(job, work / "run")
    steps, example = [], []
    for m in read_metrics(run):
        records = read_jsonl(run / "rollouts" / f"step-{int(m['step'])}.jsonl")
        sampling, grading, update, total = (
            m["time/sampling_s"],
            m["time/grading_s"],
            m.get("time/update_s", 0.0),
            m["time/step_s"],
        )
        steps.append(
            {
                "sampling_s": sampling,
                "reward_s": grading,
                "update_s": update,
                "other_s": total - sampling - grading - update,
                "step_s": total,
                "sampled_tokens": sum(r["tokens"]["sampled"] for r in records),
                "generated_tokens": sum(
                    r["tokens"]["sampled"] for r in records
                ),  # nothing sampled is dropped
                "rollouts": len(records),
                "update_rows": m.get("train/rollouts", 0.0),
                "update_tokens": m.get("train/tokens", 0.0),
                "update_context_tokens": _context_tokens_in_update(records),
                "replies": sum(r["num_turns"] for r in records),
                "tool_calls": sum(
                    r["num_tool_calls"] for r in records
                ),  # each is answered by a tool message, malformed ones too
                "reward_mean": m.get("reward/mean"),
            }
        )
        called = [r for r in records if r["num_tool_calls"]]
        if called and not example:
            for t in called[0]["turns"]:
                example.append(_brief("assistant", t["text"]))
                example.extend(_brief("tool", res["output"]) for res in t["tool_results"])
    # The prompts its episodes started from: ChatRenderer.initial, exactly as run_episode calls it.
    tok = AutoTokenizer.from_pretrained(job.model)
    ext = job.agentrft
    renderer = ChatRenderer(tok, job.rl.tools, ext.system_prompt, ext.few_shot_messages)
    items = load_dataset(job.training_path)
    prompt_ids = [[renderer.initial(items[i])[1].tokens for i in rows] for rows in order]
    return {
        "steps": steps,
        "prompt_ids": prompt_ids,
        "rows": order,
        "native_tools": renderer.native_tools,
        "example_tool_rollout": example,
    }


def _context_tokens_in_update(records: list[dict[str, Any]]) -> int:
    """Whole-sequence tokens (prompt, replies, tool outputs) of the rollouts agentrft trains
    on: those with a non-zero group advantage, computed as its loop does."""
    import math

    import torch

    from agentrft.train.advantages import group_advantages, has_signal

    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["row"]].append(r)
    total = 0
    for rs in groups.values():
        rewards = torch.tensor(
            [math.nan if r["reward"] is None else r["reward"] for r in rs], dtype=torch.float64
        )
        if has_signal(rewards):
            total += sum(
                r["tokens"]["total"]
                for r, adv in zip(rs, group_advantages(rewards).tolist(), strict=True)
                if not math.isnan(adv) and adv != 0.0
            )
    return total


def _brief(role: str, text: str) -> str:
    text = " ".join(str(text).split())
    return f"{role}: {text[:90]}{'...' if len(text) > 90 else ''}"


# -- TRL ------------------------------------------------------------------------------------


def run_trl(task: Task, cfg: Config, dtype: str, model_dir: Path, work: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    order = step_rows(load_job(task, cfg, dtype, model_dir, work), task)
    data = [
        {"prompt": task.prompt(task.rows[i]), "answer": task.rows[i]["answer"]}
        for rows in order
        for i in rows
    ]

    def fuzzy_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [fuzzy(final_text(c), a) for c, a in zip(completions, answer, strict=True)]

    args = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        bf16=dtype == "bf16",
        fp16=False,
        per_device_train_batch_size=cfg.rows * cfg.group,
        gradient_accumulation_steps=1,
        num_generations=cfg.group,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        epsilon=0.2,
        scale_rewards="group",
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta2=0.99,
        optim="adamw_torch",
        max_grad_norm=1.0,
        gradient_checkpointing=False,  # TRL's default is True (an extra forward); agentrft does not checkpoint
        max_steps=cfg.total_steps,
        shuffle_dataset=False,
        seed=cfg.seed,
        max_tool_calling_iterations=task.max_turns - 1 if task.tools else None,
        generation_kwargs={"min_new_tokens": cfg.max_new_tokens} if cfg.fixed_length else None,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(cfg.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=fuzzy_reward,
        args=args,
        train_dataset=Dataset.from_list(data),
        peft_config=lora,
        tools=list(task.tools) or None,
    )

    times: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[float]] = defaultdict(list)
    prompt_ids: list[list[list[int]]] = []
    phase = ["update"]
    seen_dtypes: dict[str, set[str]] = defaultdict(set)

    def timed(name: str, after: Any = None) -> None:
        inner = getattr(trainer, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            before, phase[0] = phase[0], name
            t0 = time.perf_counter()
            try:
                out = inner(*a, **k)
            finally:
                phase[0] = before
            times[name].append(time.perf_counter() - t0)
            if after is not None:
                after(out)
            return out

        setattr(trainer, name, wrapper)

    def after_generate(out: Any) -> None:
        p_ids, c_ids, tool_mask, completions = out[0], out[1], out[2], out[3]
        counts["sampled_tokens"].append(
            sum(map(sum, tool_mask)) if tool_mask is not None else sum(map(len, c_ids))
        )
        counts["generated_tokens"].append(raw_generated[0])
        raw_generated[0] = 0
        counts["rollouts"].append(len(c_ids))
        counts["context_tokens"].append(
            sum(len(p) + len(c) for p, c in zip(p_ids, c_ids, strict=True))
        )
        counts["replies"].append(
            sum(
                1 if isinstance(c, str) else sum(m.get("role") == "assistant" for m in c)
                for c in completions
            )
        )
        counts["tool_calls"].append(
            sum(
                1
                for c in completions
                if not isinstance(c, str)
                for m in c
                if m.get("role") == "tool"
            )
        )
        prompt_ids.append([list(map(int, ids)) for ids in p_ids[:: cfg.group]])
        with_tool = [
            c
            for c in completions
            if not isinstance(c, str) and any(m.get("role") == "tool" for m in c)
        ]
        if with_tool and not example:
            example.extend(
                _brief(m.get("role", ""), m.get("content") or json.dumps(m.get("tool_calls")))
                for m in with_tool[0]
            )

    def after_rewards(out: Any) -> None:
        counts["reward_mean"].append(float(out.sum(dim=1).nanmean()))

    def count_generated(name: str) -> None:
        inner = getattr(trainer, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            out = inner(*a, **k)
            raw_generated[0] += sum(map(len, out[0]))
            return out

        setattr(trainer, name, wrapper)

    raw_generated = [0]  # tokens out of every generation call, kept or later cut to the budget
    example: list[str] = []  # one rollout that called the tool, to show the loop ran
    timed("_generate", after_generate)
    count_generated("_generate_single_turn")
    timed("_calculate_rewards", after_rewards)
    timed("_generate_and_score_completions")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            times["step"].append(time.perf_counter() - self.t0)

    trainer.add_callback(StepTimer())

    # Which precision the forward passes really run in: the output dtype of one base Linear.
    probe = next(
        m
        for n, m in trainer.model.named_modules()
        if n.endswith("layers.0.mlp.down_proj.base_layer")
    )
    probe.register_forward_hook(
        lambda _m, _i, out: seen_dtypes[phase[0]].add(str(out.dtype).replace("torch.", ""))
    )

    trainer.train()

    steps = []
    for k in range(len(times["step"])):
        gen, rew, gas, total = (
            times["_generate"][k],
            times["_calculate_rewards"][k],
            times["_generate_and_score_completions"][k],
            times["step"][k],
        )
        steps.append(
            {
                "sampling_s": gen,
                "reward_s": rew,
                "update_s": total - gas,
                "other_s": gas - gen - rew,
                "step_s": total,
                "sampled_tokens": counts["sampled_tokens"][k],
                "generated_tokens": counts["generated_tokens"][k],
                "rollouts": counts["rollouts"][k],
                # every rollout enters the loss, zero advantage or not
                "update_rows": counts["rollouts"][k],
                "update_tokens": counts["sampled_tokens"][k],
                "update_context_tokens": counts["context_tokens"][k],
                "replies": counts["replies"][k],
                "tool_calls": counts["tool_calls"][k],
                "reward_mean": counts["reward_mean"][k],
            }
        )
    acc = trainer.accelerator
    precision = {
        "mixed_precision": str(acc.mixed_precision),
        "native_amp": bool(getattr(acc, "native_amp", False)),
        "master_weights": str(
            next(p for p in trainer.model.parameters() if p.requires_grad).dtype
        ).replace("torch.", ""),
        "base_weights": str(probe.weight.dtype).replace("torch.", ""),
        "linear_output_dtype": {k: sorted(v) for k, v in seen_dtypes.items()},
    }
    return {
        "steps": steps,
        "prompt_ids": prompt_ids,
        "rows": order,
        "precision": precision,
        "example_tool_rollout": example,
        "chat_template_swapped": trainer.chat_template is not None,
        "torch_threads": torch.get_num_threads(),
    }
