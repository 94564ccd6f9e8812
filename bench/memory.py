"""Peak resident memory per phase of a training run, with and without giving freed heap
memory back to the OS after each phase (`agentrft.memory.release_free_memory`).

    .venv/bin/python bench/memory.py [--steps 8]

Each set-up trains the examples/directory job (one HTTP tool, 2 rows x 4 rollouts per step,
LoRA) in its own process and prints, per step, the peak RSS of the sampling, grading and
update phases from the run's metrics.jsonl. The grading phase comes right after sampling
and does almost no work, so its peak is what stayed resident.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(run_dir: Path, steps: int, release: bool) -> None:
    import agentrft.rollout.group as rollout_module
    import agentrft.train.loop as loop_module
    from agentrft.job import load_job
    from agentrft.train.loop import train

    if not release:  # the behaviour before: freed memory stays with malloc
        loop_module.release_free_memory = rollout_module.release_free_memory = lambda: False  # type: ignore[assignment]
    job = load_job(ROOT / "examples/directory/job.yaml")
    rl = job.rl.model_copy(
        update={"hyperparameters": job.rl.hyperparameters.model_copy(update={"batch_size": 2})}
    )
    ext = job.agentrft.model_copy(
        update={
            "group_size": 4,
            "train": job.agentrft.train.model_copy(
                update={"max_steps": steps, "checkpoint_interval": 10**6}
            ),
        }
    )
    job = job.model_copy(
        update={
            "seed": 1,
            "validation_file": None,
            "method": job.method.model_copy(update={"reinforcement": rl}),
            "agentrft": ext,
        }
    )
    train(job, run_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--worker", choices=["release", "keep"], help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.run_dir), args.steps, args.worker == "release")
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[str, list[dict[str, float]]] = {}
        for mode in ("keep", "release"):
            run = Path(tmp) / mode
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    mode,
                    "--run-dir",
                    str(run),
                    "--steps",
                    str(args.steps),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            rows[mode] = [
                json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            ]
    print(
        f"peak RSS per phase (MiB), examples/directory, {args.steps} steps; keep = freed memory stays with malloc, release = malloc_trim after each phase"
    )
    print(f"{'step':>4}  {'sampling':>17}  {'grading (resident)':>19}  {'update':>17}")
    print(
        f"{'':>4}  {'keep':>8} {'release':>8}  {'keep':>9} {'release':>9}  {'keep':>8} {'release':>8}"
    )
    for keep, rel in zip(rows["keep"], rows["release"], strict=True):
        cells = [
            f"{keep[f'memory/{p}_peak_mb']:>{w}.0f} {rel[f'memory/{p}_peak_mb']:>{w}.0f}"
            for p, w in (("sampling", 8), ("grading", 9), ("update", 8))
        ]
        print(f"{keep['step']:>4}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
