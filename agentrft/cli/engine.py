"""`--engine auto|local|vllm` on the commands that sample (train, eval, preflight, sample,
rollout, demo): it overrides the job's `agentrft.engine` for everything the command runs."""

from __future__ import annotations

import argparse
import os

from agentrft.engine import ENGINE_ENV


def add_engine_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=["auto", "local", "vllm"],
        default=None,
        help="what samples the rollouts (default: the job's agentrft.engine, auto): local is "
        "agentrft's own sampler; vllm starts a vLLM server from .venv-engine (`make engine`)",
    )


def apply_engine_flag(args: argparse.Namespace) -> None:
    if getattr(args, "engine", None):
        os.environ[ENGINE_ENV] = args.engine
