"""`python` (OpenAI): the user's `def grade(sample, item) -> float`, run isolated.

    {"type": "python", "name": "...", "source": "def grade(sample, item):\\n    return 1.0",
     "image_tag": "2025-05-08",                 # image_tag is accepted and ignored
     "agentrft": {"sandbox": {"cpu_s": 10, "wall_s": 30, "memory_mb": 512, "pids": 32}}}  # optional

Each call runs in a fresh bubblewrap sandbox (see agentrft.sandbox): no network, no
privileges, a read-only filesystem except its own temporary directory, and CPU-time,
memory, process and file-size limits (OpenAI's: 2 min, 2 GB, 1 GB by default). The
grader's `agentrft.sandbox` sets them; the job's `agentrft.sandbox` and `agentrft grader run
--cpu-s ...` set the defaults it overrides.
The grader sees agentrft's own Python environment (numpy, rapidfuzz, nltk, rouge-score,
... as installed), not OpenAI's image.

Outcomes: a finite number is the score. An exception, a non-number, NaN or a crash flags
`python_grader_runtime_error` (memory exhaustion shows as MemoryError there); running past
the CPU or wall-clock limit flags `python_grader_timeout`. OpenAI scores these 0; here the
sample is excluded instead. Where bubblewrap is missing, grading raises SandboxUnavailable.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrft import sandbox
from agentrft.errors import ConfigError
from agentrft.graders.protocol import AsyncGrader, checked_score, failed
from agentrft.graders.spec import BuildContext, Strict
from agentrft.sandbox import Limits, run_sandboxed
from agentrft.types import Grade

MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit

# Runs inside the sandbox: load the inputs, exec the user's file, call grade, write a verdict.
_RUNNER = r"""
import json, sys, traceback
def verdict(obj):
    with open("result.json", "w") as fh:
        json.dump(obj, fh)
try:
    with open("input.json") as fh:
        data = json.load(fh)
    ns = {"__name__": "grader"}
    with open("grader.py") as fh:
        exec(compile(fh.read(), "grader.py", "exec"), ns)
    value = ns["grade"](data["sample"], data["item"])
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        value = repr(value)
    verdict({"ok": True, "value": value})
except BaseException as exc:
    tb = traceback.format_exc(limit=-8)
    try:
        verdict({"ok": False, "type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tb[-4000:]})
    except BaseException:
        sys.exit(70)
"""


class SandboxSpec(Strict):
    """Sandbox limits (agentrft's addition; unset fields keep the defaults, see
    agentrft.sandbox.Limits). With a cgroup they hold for the whole sandbox together."""

    cpu_s: int | None = Field(default=None, ge=1)  # CPU seconds
    wall_s: float | None = Field(default=None, gt=0)  # wall-clock seconds
    memory_mb: int | None = Field(default=None, ge=32)
    file_mb: int | None = Field(default=None, ge=1)  # largest file written
    pids: int | None = Field(default=None, ge=8)  # processes and threads at once

    def apply(self, base: Limits) -> Limits:
        return dataclasses.replace(
            base, **{k: v for k, v in self.model_dump().items() if v is not None}
        )

    def limits(self) -> Limits:
        """These limits over the defaults (OpenAI's)."""
        return self.apply(Limits())


class PythonExtension(Strict):
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)


class PythonSpec(Strict):
    type: Literal["python"]
    name: str = "python"
    source: str = Field(min_length=1)
    image_tag: str | None = None
    agentrft: PythonExtension | None = None  # {"sandbox": {"cpu_s": 10, "memory_mb": 512, ...}}


def check_source(source: str, where: str) -> None:
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise ConfigError(f"{where}: the source is over 256 KiB; move data into the dataset item")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ConfigError(f"{where}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grade"]
    if not fns:
        raise ConfigError(
            f"{where}: define a top-level function `def grade(sample, item) -> float`"
        )
    args = fns[-1].args
    if len(args.posonlyargs) + len(args.args) != 2 or args.vararg or args.kwonlyargs:
        raise ConfigError(
            f"{where}: `grade` must take exactly two arguments: def grade(sample, item) -> float"
        )


class PythonGrader(AsyncGrader):
    type = "python"

    def __init__(self, spec: PythonSpec, limits: Limits) -> None:
        self.spec = spec
        self.name = spec.name
        self.limits = limits

    async def _agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str
    ) -> Grade:
        workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="agentrft-grader-"))
        try:
            (workdir / "grader.py").write_text(self.spec.source)
            (workdir / "input.json").write_text(
                json.dumps({"sample": sample, "item": item}, ensure_ascii=False, default=str)
            )
            res = await run_sandboxed([sys.executable, "-I", "-c", _RUNNER], workdir, self.limits)
            verdict_path = workdir / "result.json"
            verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else None
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)
        if res.memory_limit:
            return failed(
                "python_grader_runtime_error",
                f"killed at the sandbox's memory limit of {self.limits.memory_mb} MB",
                stderr=res.stderr[-2000:],
            )
        if res.timed_out:
            why = (
                f"killed at the wall-clock limit of {self.limits.wall_s:g}s"
                if res.wall_timeout
                else f"killed at the CPU limit of {self.limits.cpu_s}s (or for memory)"
            )
            return failed("python_grader_timeout", why, stderr=res.stderr[-2000:])
        if verdict is None:
            return failed(
                "python_grader_runtime_error",
                f"the grader process died (exit {res.returncode}) without a result",
                stderr=res.stderr[-2000:],
            )
        if not verdict["ok"]:
            hint = (
                f" (memory limit {self.limits.memory_mb} MB)"
                if verdict["type"] == "MemoryError"
                else ""
            )
            return failed(
                "python_grader_runtime_error",
                f"{verdict['type']}: {verdict['message']}{hint}",
                traceback=verdict["traceback"],
                stdout=res.stdout[-2000:],
            )
        try:
            score = checked_score(verdict["value"])
        except ValueError as exc:
            return failed(
                "python_grader_runtime_error", f"grade() must return a finite float: {exc}"
            )
        return Grade(score, {}, {"stdout": res.stdout[-2000:]} if res.stdout else {})


def build(spec: PythonSpec, path: str, ctx: BuildContext) -> PythonGrader:
    check_source(spec.source, f"{path}.source")
    if ctx.check_resources:
        sandbox.announce()  # at the start of a run: which protections hold here
    limits = ctx.python_limits or Limits()
    if spec.agentrft is not None:  # the grader's own limits win over the caller's defaults
        limits = spec.agentrft.sandbox.apply(limits)
    return PythonGrader(spec, limits)
