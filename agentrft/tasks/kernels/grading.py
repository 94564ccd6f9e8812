"""The kernel recipe's three graders, in gate order; job.yaml runs each as a `python` grader,
so all of this runs inside agentrft's sandbox (bubblewrap, no network, no privileges).

    static   gate 1: AST checks on the submitted code (static_checks.py); nothing runs
    correct  gate 2: the share of inputs (odd shapes and the timing shape) on which the kernel
             matches the reference within the output dtype's tolerance
    speed    the reward: 0.2 for a correct kernel no faster than the reference, rising with
             log-speedup to 1.0 at 8x; 0 when any timed call is wrong

The model's code never shares a process with the grader. The grader (trusted: it builds the
inputs and runs the reference) starts a child interpreter, sends it the submission and the
inputs on stdin, and reads back outputs and timings; the expected outputs never leave the
grader. The child's harness binds its timer and the functions it needs before the submission
is loaded, so a submission that patched them would change nothing it reads; the static gate
refuses such code anyway. Timing: warm-up calls, then a median over repeats, each call on a
fresh input (a cache keyed by input never hits), every timed output checked. The reference
is timed in the grader before and after the child, on the same inputs, with the same single
thread (the sandbox sets OMP_NUM_THREADS=1; the gate refuses set_num_threads).
"""

from __future__ import annotations

import ast
import io
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import static_checks

WARMUP = 2
REPEATS = 7
CHILD_TIMEOUT_S = 60.0
MIN_SPEEDUP = 1.1  # below this a speedup is timing noise: no bonus
FULL_SPEEDUP = 8.0  # log-speedup reaches the full reward here
CORRECT_FLOOR = 0.2  # a correct kernel no faster than the reference

_KERNEL = re.compile(r"^def kernel\s*\(", re.M)
_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)

# The child: load the submission, call it on each input, send outputs and times back.
CHILD = r"""
import io, os, sys
from time import perf_counter
import numpy as np
import torch
_Tensor, _ndarray, _equal, _from_numpy, _save = torch.Tensor, np.ndarray, torch.equal, torch.from_numpy, torch.save
_out = os.fdopen(os.dup(1), "wb")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
data = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
sys.stdin.close()
result = {"error": "", "outputs": [], "times": []}
def finish():
    buf = io.BytesIO()
    _save(result, buf)
    _out.write(buf.getvalue())
    _out.flush()
    os._exit(0)
try:
    ns = {"__name__": "kernel_submission"}
    exec(compile(data["code"], "kernel.py", "exec"), ns)
    kernel = ns["kernel"]
except BaseException as exc:
    result["error"] = f"the submission fails to load: {type(exc).__name__}: {exc}"[:500]
    finish()
for i, args in enumerate(data["calls"]):
    keep = [a.clone() if type(a) is _Tensor else a for a in args]
    try:
        t0 = perf_counter()
        out = kernel(*args)
        t = perf_counter() - t0
        if type(out) is _ndarray:
            out = _from_numpy(np.array(out, copy=True))
        elif type(out) is _Tensor:
            out = out.detach().clone()
        else:
            result["error"] = f"call {i}: kernel returned {type(out).__name__}, not a torch.Tensor or numpy.ndarray"
            break
    except BaseException as exc:
        result["error"] = f"call {i}: kernel raised {type(exc).__name__}: {exc}"[:500]
        break
    if any(type(a) is _Tensor and not _equal(a, k) for a, k in zip(args, keep)):
        result["error"] = f"call {i}: kernel modified its inputs"
        break
    result["outputs"].append(out)
    result["times"].append(t)
finish()
"""


def extract_code(text: str) -> str | None:
    """The submitted code: the last fenced block that defines `kernel` at its top level (one
    that parses wins over one that does not; a block cut off at the end counts), else the
    whole answer when it defines `kernel`."""
    blocks = [b for b in _CODE.findall(text or "") if _KERNEL.search(b)]
    parsed = [b for b in blocks if _parses(b)]
    if parsed or blocks:
        return (parsed or blocks)[-1]
    return text if text and _KERNEL.search(text) else None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def speed_score(t_reference: float, t_kernel: float) -> float:
    """The reward of a correct kernel from its median time and the reference's."""
    if not (t_kernel > 0 and t_reference > 0):
        return CORRECT_FLOOR
    gain = math.log(t_reference / t_kernel / MIN_SPEEDUP) / math.log(FULL_SPEEDUP / MIN_SPEEDUP)
    return CORRECT_FLOOR + (1 - CORRECT_FLOOR) * min(1.0, max(0.0, gain))


def run_kernel(
    code: str, calls: Sequence[Sequence[Any]], timeout_s: float = CHILD_TIMEOUT_S
) -> dict[str, Any]:
    """Outputs and times of `kernel(*args)` for each call, from a child interpreter; `error`
    says why it stopped early."""
    import torch

    buf = io.BytesIO()
    torch.save({"code": code, "calls": [list(c) for c in calls]}, buf)
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", CHILD],
            input=buf.getvalue(),
            capture_output=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:g}s", "outputs": [], "times": []}
    try:
        result = torch.load(io.BytesIO(proc.stdout), weights_only=True)
    except Exception:
        tail = proc.stderr.decode("utf-8", "replace")[-300:]
        return {
            "error": f"the kernel process died (exit {proc.returncode}): {tail}",
            "outputs": [],
            "times": [],
        }
    return dict(result)


def mismatch(out: Any, expected: Any, tolerance: dict[str, float] | None) -> str:
    """Why `out` is not `expected` ('' when it matches within the dtype's tolerance)."""
    import torch

    from agentrft.tasks.kernels.dataset import tolerance_for

    if out.dtype != expected.dtype:
        return f"dtype {out.dtype} instead of {expected.dtype}"
    if out.shape != expected.shape:
        return f"shape {tuple(out.shape)} instead of {tuple(expected.shape)}"
    if not expected.dtype.is_floating_point:
        return "" if torch.equal(out, expected) else "values differ"
    rtol, atol = tolerance_for(str(expected.dtype).removeprefix("torch."), tolerance)
    if torch.allclose(out, expected, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    diff = (out.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
    return f"values differ (max abs error {diff:.3g}; rtol {rtol:g}, atol {atol:g})"


def _inputs(item: dict[str, Any], sizes: dict[str, int], seed: int) -> list[Any]:
    from agentrft.tasks.kernels.dataset import build_inputs

    return build_inputs(item["args"], sizes, seed)


def _reference(item: dict[str, Any]) -> Any:
    from agentrft.tasks.kernels.dataset import reference_function

    return reference_function(item["reference"])


def _copy(args: Sequence[Any]) -> list[Any]:
    return [a.clone() if hasattr(a, "clone") else a for a in args]


def grade_static(sample: dict[str, Any], item: dict[str, Any]) -> float:
    found = static_checks.problems(extract_code(str(sample.get("output_text") or "")), item)
    for line in found:
        print(line)
    return 0.0 if found else 1.0


def grade_correct(sample: dict[str, Any], item: dict[str, Any]) -> float:
    """The share of inputs (each case, then the timing shape) on which the kernel is right."""
    code = extract_code(str(sample.get("output_text") or ""))
    if static_checks.problems(code, item):  # never run code the gate refused, whoever calls
        print("static gate failed: nothing run")
        return 0.0
    assert code is not None
    seed = int(item.get("seed") or 0)
    sizes = [*item["cases"], item["timing"]]
    calls = [_inputs(item, s, seed + i) for i, s in enumerate(sizes)]
    ref = _reference(item)
    expected = [ref(*_copy(c)) for c in calls]
    res = run_kernel(code, calls)
    good = 0
    for i, (out, exp) in enumerate(zip(res["outputs"], expected, strict=False)):
        why = mismatch(out, exp, item.get("tolerance"))
        print(f"input {i} {sizes[i]}: {why or 'ok'}")
        good += not why
    if res["error"]:
        print(res["error"])
    return good / len(calls)


def _median_time(fn: Any, calls: Sequence[Sequence[Any]]) -> tuple[float, list[Any]]:
    outs, times = [], []
    for c in calls:
        args = _copy(c)
        t0 = time.perf_counter()
        outs.append(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:]), outs[WARMUP:]


def grade_speed(sample: dict[str, Any], item: dict[str, Any]) -> float:
    """speed_score of the kernel's median time against the reference's; 0 when a timed call
    fails or is wrong."""
    code = extract_code(str(sample.get("output_text") or ""))
    if static_checks.problems(code, item):
        print("static gate failed: nothing run")
        return 0.0
    assert code is not None
    seed = int(item.get("seed") or 0) + 1000
    calls = [_inputs(item, item["timing"], seed + j) for j in range(WARMUP + REPEATS)]
    ref = _reference(item)
    t_before, expected = _median_time(ref, calls)
    res = run_kernel(code, calls)
    t_after, _ = _median_time(ref, calls)
    if res["error"]:
        print(res["error"])
        return 0.0
    for j, (out, exp) in enumerate(zip(res["outputs"][WARMUP:], expected, strict=True)):
        if why := mismatch(out, exp, item.get("tolerance")):
            print(f"timed call {j}: {why}")
            return 0.0
    t_ref = min(t_before, t_after)
    t_kernel = statistics.median(res["times"][WARMUP:])
    score = speed_score(t_ref, t_kernel)
    print(
        f"reference {t_ref * 1e3:.3f} ms  kernel {t_kernel * 1e3:.3f} ms  speedup {t_ref / t_kernel:.2f}x  score {score:.3f}"
    )
    return score
