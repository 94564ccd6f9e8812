"""`agentrft grader validate|run`: OpenAI's grader test API (`fine_tuning.alpha.graders`) on
the command line, so a grader can be tried on one sample before a run spends hours on it.

    agentrft grader validate GRADER.json
    agentrft grader run GRADER.json --sample S.json --item I.json [--trace-id T] [--json]

GRADER.json may be the grader, an OpenAI payload `{"grader": ...}`, or a whole job file.
S.json is a sample object (`{"output_text": ..., ...}`), a JSON string, or plain text (the
`model_sample` of OpenAI's run API). `run` prints the reward, the sub-rewards and any error
flag, and exits 1 when the sample could not be graded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from agentrft.config import read_text_file
from agentrft.errors import ConfigError
from agentrft.graders.protocol import run_response


def _read_sample(path: str) -> dict[str, Any]:
    from agentrft.graders.sample import sample_from_text

    text = read_text_file(path, "sample") if path != "-" else sys.stdin.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return sample_from_text(text)
    if isinstance(data, str):
        return sample_from_text(data)
    if isinstance(data, dict) and "model_sample" in data and "output_text" not in data:
        return sample_from_text(str(data["model_sample"]))
    if isinstance(data, dict) and isinstance(data.get("output_text"), str):
        return {**sample_from_text(data["output_text"]), **data}
    raise ConfigError(
        f'{path}: a sample is an object with "output_text" (plus any of output_json, output_tools, tool_calls, ...), a JSON string, or plain text'
    )


def _read_item(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(read_text_file(path, "item"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}) -> the item is one JSON object (a dataset row without `messages`)"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an item is a JSON object (a dataset row without `messages`)")
    return {k: v for k, v in data.items() if k != "messages"}


def _judge_config(args: argparse.Namespace) -> Any:
    from agentrft.graders.judge import JudgeConfig

    base: dict[str, Any] = {}
    if args.job:
        from agentrft.job import load_job

        judge = getattr(load_job(args.job).agentrft, "judge", None)
        base = judge.model_dump(exclude_unset=True) if judge is not None else {}
    for key, value in (
        ("base_url", args.judge_url),
        ("model", args.judge_model),
        ("api_key_env", args.judge_api_key_env),
    ):
        if value is not None:
            base[key] = value
    return JudgeConfig.model_validate(base)


def _in_file(path: str, build: Any) -> Any:
    """`build()`, with the grader file named in front of a field error (`grader.x: ...`)."""
    try:
        return build()
    except ConfigError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {exc}") from None


def _sandbox_limits(args: argparse.Namespace) -> Any:
    """Sandbox limits for python graders from the --cpu-s/--wall-s/... flags (a grader's own
    `agentrft.sandbox` still wins)."""
    from agentrft.sandbox import Limits

    given = {
        k: getattr(args, k)
        for k in ("cpu_s", "wall_s", "memory_mb", "pids")
        if getattr(args, k, None) is not None
    }
    for key, value in given.items():
        if value <= 0:
            raise ConfigError(f"--{key.replace('_', '-')} must be positive, got {value:g}")
    base = Limits()
    if getattr(args, "job", None):  # the job's agentrft.sandbox, under the flags
        from agentrft.job import load_job

        base = load_job(args.job).agentrft.sandbox.limits()
    return dataclasses.replace(base, **given)


def cmd_validate(args: argparse.Namespace) -> int:
    from agentrft.graders.build import load_grader_spec, validate_grader

    grader = _in_file(args.grader, lambda: validate_grader(load_grader_spec(args.grader)))
    print(f"valid: {grader.type} grader {grader.name!r}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from agentrft.graders.build import build_grader, load_grader_spec

    grader = _in_file(
        args.grader,
        lambda: build_grader(
            load_grader_spec(args.grader),
            judge=_judge_config(args),
            python_limits=_sandbox_limits(args),
        ),
    )
    sample = _read_sample(args.sample) if args.sample else None
    if sample is None:
        from agentrft.graders.sample import sample_from_text

        if args.model_sample is None:
            raise ConfigError("give the sample to grade: --sample FILE or --model-sample TEXT")
        sample = sample_from_text(args.model_sample)
    grade = grader.grade(sample, _read_item(args.item), args.trace_id)
    resp = run_response(grader, grade)
    if args.json:
        print(json.dumps(resp, indent=2, ensure_ascii=False, default=str))
    else:
        reward = "-" if resp["reward"] is None else f"{resp['reward']:.6g}"
        print(f"reward: {reward}")
        subs = "  ".join(f"{k}={v:.6g}" for k, v in grade.sub_scores.items() if not math.isnan(v))
        print(f"sub_rewards: {subs or '-'}")
        print(
            f"errors: {grade.error or 'none'}"
            + (f" ({grade.metrics.get('error_details')})" if grade.error else "")
        )
        for key in ("label", "judge_reply", "stdout", "stderr", "traceback"):
            if grade.metrics.get(key):
                print(f"{key}: {str(grade.metrics[key]).strip()[:1000]}")
    return 1 if grade.error else 0


def add_commands(subparsers: Any) -> None:
    """Register `agentrft grader ...` on the main parser's subparsers."""
    g = subparsers.add_parser(
        "grader", help="validate a grader or run it on one sample (OpenAI's grader test API)"
    )
    sub = g.add_subparsers(dest="grader_command", required=True)

    v = sub.add_parser(
        "validate", help="check grader JSON; exit 2 with the field and the fix if it is wrong"
    )
    v.add_argument(
        "grader", help='grader JSON/YAML, an OpenAI {"grader": ...} payload, or a job file'
    )
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="grade one sample and print reward, sub_rewards and error flags")
    r.add_argument(
        "grader", help='grader JSON/YAML, an OpenAI {"grader": ...} payload, or a job file'
    )
    r.add_argument(
        "--sample",
        help="sample JSON ({\"output_text\": ...}), a JSON string, or a text file ('-' for stdin)",
    )
    r.add_argument("--model-sample", help="the model's output as text (instead of --sample)")
    r.add_argument("--item", help="the dataset item as JSON (a row's fields)")
    r.add_argument("--trace-id", default="trace_grader_run", help="sent to endpoint graders")
    r.add_argument("--json", action="store_true", help="print OpenAI's grader-run response as JSON")
    r.add_argument(
        "--job",
        help="take the judge settings (agentrft.judge) and sandbox limits (agentrft.sandbox) from this job file",
    )
    r.add_argument(
        "--judge-url",
        help="OpenAI-compatible endpoint for model graders (e.g. http://127.0.0.1:8000/v1)",
    )
    r.add_argument(
        "--judge-model",
        help="judge model for every model grader (default: the grader's own `model`)",
    )
    r.add_argument(
        "--judge-api-key-env", help="environment variable holding the judge endpoint's API key"
    )
    r.add_argument("--cpu-s", type=int, help="python graders: CPU seconds (default 120)")
    r.add_argument("--wall-s", type=float, help="python graders: wall-clock seconds (default 300)")
    r.add_argument("--memory-mb", type=int, help="python graders: memory in MB (default 2048)")
    r.add_argument(
        "--pids", type=int, help="python graders: processes and threads at once (default 64)"
    )
    r.set_defaults(func=cmd_run)
