"""How often the 135M model writes an invalid tool call, with and without grammar-constrained
tool calls (`agentrft.sampling.constrained_tool_calls`), on one job's rows.

    .venv/bin/python bench/constrained_calls.py [JOB] [--data FILE] [--rows N] [-k 4]
        [--no-few-shot]

JOB defaults to the quickstart. Both variants drop the job's prefill (the quickstart's opens
the call), so the model decides alone whether and how to call. `--no-few-shot` also drops the job's worked examples. Both
variants run one after the other on the same rows, seed and temperature, from the base model;
the table prints invalid calls (a `<tool_call>` that does not parse or fails its tool's
schema), calls made, tool errors and reward. The two evals are written under --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", type=Path, default=ROOT / "examples/quickstart/job.yaml")
    parser.add_argument(
        "--data", type=Path, default=None, help="JSONL rows (default: training file)"
    )
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("-k", type=int, default=4, help="rollouts per row (default 4)")
    parser.add_argument("--no-few-shot", action="store_true", help="drop the worked examples")
    parser.add_argument("--out", type=Path, default=None, help="where the two evals go")
    args = parser.parse_args()
    from agentrft.config import load_mapping_file
    from agentrft.data.jsonl import load_dataset
    from agentrft.evaluate.measure import evaluate_model
    from agentrft.job import job_from_dict

    out = args.out or Path(tempfile.mkdtemp(prefix="constrained_calls-"))
    results = {}
    for constrained in (False, True):
        spec = load_mapping_file(args.job, "job")
        spec.setdefault("agentrft", {}).pop("prefill", None)
        if args.no_few_shot:
            spec["agentrft"].pop("few_shot_messages", None)
        spec["agentrft"].setdefault("sampling", {})["constrained_tool_calls"] = constrained
        job = job_from_dict(spec, source=str(args.job), base_dir=args.job.resolve().parent)
        rows = load_dataset(args.data or job.training_path, limit=args.rows)
        label = "constrained" if constrained else "free"
        results[label] = evaluate_model(job, rows, args.k, "base", out / label, label=label)
    print(f"{'metric':34} {'free':>10} {'constrained':>12}")
    for name, key in (
        ("rollouts", lambda r: r["rollouts"]),
        ("invalid calls", lambda r: r["invalid_tool_calls"]),
        ("tool calls (mean per rollout)", lambda r: r["tool_calls"]["mean"]),
        ("tool errors", lambda r: r["tool_errors"]),
        ("reward (mean)", lambda r: r["reward"]["mean"]),
        ("wall s", lambda r: r["wall_s"]),
    ):
        free, con = (key(results[n]) for n in ("free", "constrained"))
        print(f"{name:34} {free:10.3f} {con:12.3f}")
    (out / "summary.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"evals in {out}")


if __name__ == "__main__":
    main()
