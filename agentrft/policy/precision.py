"""How the sampler's arithmetic runs on this hardware: the precision (`dtype: auto` picks
bf16 only where the hardware computes it natively, fp32 everywhere else) and, on a CPU, the
layout of the weights its matmuls read.

Why the precision matters: bf16 on a CPU with bf16 matrix units (avx512_bf16, amx_bf16) was
about 1.6x faster than fp32 for training; on an AVX2-only CPU a bf16 matmul is emulated and
ran about 65x *slower* than fp32. So the default cannot be fixed, and every run says what it
chose.

Why the layout matters: a decode step multiplies a few rows (the batch) by every weight.
At 16 rows, torch's plain fp32 `linear` ran at a third of what the same CPU does on weights
reordered once into oneDNN's blocked layout (the reorder inductor's freezing pass does), so
the sampling model's weights are prepacked where that measures faster.

    choose_dtype(...)   the decision, from facts passed in (unit-tested without this machine)
    resolve_dtype(...)  the same decision with the facts read from this machine
    bf16_autocast(...)  the one bf16 autocast, for sampling and for the update
    PackedLinears       prepacked copies of a model's Linear weights, used inside `active()`
    packing_speedup()   prepacked over plain matmul throughput on this CPU, once per process
    use_packing(dtype)  the choice made from it, once per process (or pinned: see below)

The packing choice is timed, so two processes on one busy machine can choose differently,
and the two layouts round differently: a resumed run would then sample other tokens than
the run it continues. A run therefore records its choices (`packing_choices`) in each
checkpoint, and a resume pins them (`pin_packing`). `AGENTRFT_PACKED_MATMULS=on|off` fixes
the choice for a process by hand.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Collection, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from agentrft.errors import ConfigError

Dtype = Literal["fp32", "bf16"]
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 CPU flags of native bf16 matrix arithmetic
MIN_BF16_SPEEDUP = 1.0  # the micro-benchmark picks bf16 only when it is at least as fast as fp32
# Values of oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA, formerly DNNL_MAX_CPU_ISA) that keep it off
# the CPU's bf16 dot-product instructions: with one of these set, torch's bf16 matmuls are
# emulated even on a CPU whose flags list avx512_bf16 (measured: 0.6 GFLOP/s under AVX2).
ONEDNN_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


@dataclass(frozen=True)
class DtypeChoice:
    dtype: Dtype
    reason: str

    def __str__(self) -> str:
        return f"{self.dtype} ({self.reason})"


def choose_dtype(
    requested: str,
    device_type: str,
    *,
    cpu_flags: Collection[str] | None = None,
    cpu_name: str = "",
    cuda_bf16: bool | None = None,
    bf16_speedup: Callable[[], float] | None = None,
    onednn_isa_cap: tuple[str, str] | None = None,
) -> DtypeChoice:
    """The precision for `requested` ("auto", "bf16" or "fp32") on `device_type` ("cpu", "cuda").

    On a CPU the flags decide when they are known (x86 Linux): bf16 with avx512_bf16 or
    amx_bf16, fp32 without. Where they are not (other systems, ARM), `bf16_speedup()`, a
    micro-benchmark's bf16/fp32 throughput ratio, decides; without one, fp32.
    `onednn_isa_cap`, (variable, value) of a oneDNN ISA cap set in the environment, overrules
    the flags when it keeps oneDNN off the bf16 instructions.
    """
    if requested in ("bf16", "fp32"):
        return DtypeChoice(requested, "set in the job or on the command line")  # type: ignore[arg-type]  # narrowed by the test above
    if requested != "auto":
        raise ValueError(f"dtype must be auto, bf16 or fp32, not {requested!r}")
    if device_type == "cuda":
        if cuda_bf16:
            return DtypeChoice("bf16", "auto: the GPU computes bf16 natively")
        return DtypeChoice("fp32", "auto: the GPU has no native bf16")
    cpu = f"{cpu_name} " if cpu_name else ""
    flags = set(cpu_flags) if cpu_flags is not None else None
    if onednn_isa_cap is not None and onednn_isa_cap[1].upper() in ONEDNN_ISAS_WITHOUT_BF16:
        variable, value = onednn_isa_cap
        return DtypeChoice(
            "fp32",
            f"auto: {variable}={value} keeps oneDNN off the CPU's bf16 instructions, so bf16 would be emulated (far slower)",
        )
    if flags is not None:  # an x86 CPU (ARM lists "Features" instead, and the benchmark decides)
        native = [f for f in BF16_FLAGS if f in flags]
        if native:
            return DtypeChoice("bf16", f"auto: the CPU {cpu}has {' and '.join(native)}")
        return DtypeChoice(
            "fp32",
            f"auto: the CPU {cpu}has no avx512_bf16 or amx_bf16, so bf16 would be emulated (far slower)",
        )
    if bf16_speedup is None:
        return DtypeChoice("fp32", f"auto: the CPU {cpu}does not say whether it has bf16 units")
    ratio = bf16_speedup()
    if ratio >= MIN_BF16_SPEEDUP:
        return DtypeChoice(
            "bf16",
            f"auto: a bf16 matmul ran {ratio:.2f}x as fast as fp32 on the CPU {cpu}".rstrip(),
        )
    return DtypeChoice(
        "fp32",
        f"auto: a bf16 matmul ran at {ratio:.2f}x the speed of fp32 on the CPU {cpu}".rstrip(),
    )


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str] | None]:
    """The CPU's model name and its flags (None where the file or the flags line is missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "", None
    name, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
    return name, flags


@functools.cache
def measured_bf16_speedup(size: int = 512, seconds: float = 0.1) -> float:
    """bf16 matmul throughput over fp32 on this CPU; about a quarter of a second, once per process."""

    def rate(dtype: torch.dtype) -> float:
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        a @ b  # warm-up
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            a @ b
            n += 1
        return n / elapsed

    return rate(torch.bfloat16) / rate(torch.float32)


def bf16_autocast(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on `device` when `enabled` (bf16 asked for over fp32 weights), else nothing."""
    return (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if enabled
        else contextlib.nullcontext()
    )


def resolve_dtype(requested: str, device_type: str) -> DtypeChoice:
    """`choose_dtype` with this machine's facts: /proc/cpuinfo, a oneDNN ISA cap in the
    environment, the GPU, and the micro-benchmark where the flags say nothing."""
    if requested != "auto":
        return choose_dtype(requested, device_type)
    if device_type == "cuda":
        return choose_dtype(requested, device_type, cuda_bf16=torch.cuda.is_bf16_supported())
    name, flags = read_cpuinfo()
    cap = next(((v, os.environ[v]) for v in ONEDNN_ISA_ENV if os.environ.get(v)), None)
    return choose_dtype(
        requested,
        device_type,
        cpu_flags=flags,
        cpu_name=name,
        bf16_speedup=measured_bf16_speedup,
        onednn_isa_cap=cap,
    )


PACK_ROWS = 16  # the row count oneDNN is told to expect: a decode batch
MIN_PACKING_SPEEDUP = 1.1  # prepack only where it is clearly faster than plain `linear`
PACKING_ENV = "AGENTRFT_PACKED_MATMULS"  # on | off: the choice by hand, for this process
_PACKING: dict[str, bool] = {}  # dtype name -> packed, as chosen (or pinned) in this process


def use_packing(dtype: torch.dtype) -> bool:
    """Whether the sampler's matmuls in `dtype` run on prepacked weights, in this process:
    pinned by `pin_packing`, else set by AGENTRFT_PACKED_MATMULS, else measured once. Never
    where this CPU's oneDNN cannot pack `dtype` (a run resumed on another machine)."""
    key = str(dtype).removeprefix("torch.")
    if key not in _PACKING:
        by_hand = os.environ.get(PACKING_ENV, "").strip().lower()
        if by_hand not in ("", "on", "off"):
            raise ConfigError(f"{PACKING_ENV}={by_hand!r}: use on or off, or leave it unset")
        _PACKING[key] = (
            by_hand == "on" if by_hand else packing_speedup(dtype) >= MIN_PACKING_SPEEDUP
        )
    return _PACKING[key] and _packing_sample(dtype) is not None


def packing_choices() -> dict[str, bool]:
    """The choices made so far in this process, by dtype name: what a checkpoint records."""
    return dict(_PACKING)


def pin_packing(choices: dict[str, bool]) -> None:
    """Make the choices a checkpoint recorded this process's, so a resumed run samples
    with the layout (and so the rounding) of the run it continues."""
    _PACKING.update(choices)


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def _packing_sample(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """An input, a small model's MLP weight and its prepacked copy in `dtype`, or None where
    oneDNN cannot pack it or its product differs from plain `linear`'s."""
    if not torch.backends.mkldnn.is_available():
        return None
    x = torch.randn(PACK_ROWS, 512).to(dtype)
    w = torch.randn(2048, 512).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        same = torch.allclose(
            _packed_linear(x, packed, None).float(),
            torch.nn.functional.linear(x, w).float(),
            rtol=1e-2,
            atol=1e-2 * float(w.float().abs().max()),
        )
    except RuntimeError:
        return None
    return (x, w, packed) if same else None


@functools.cache
def packing_speedup(dtype: torch.dtype, seconds: float = 0.05) -> float:
    """Prepacked over plain `linear` throughput on this CPU at a decode batch's row count, for
    a small model's MLP weight in `dtype`; 0.0 where oneDNN cannot run it or its result
    differs. The fastest of repeated calls counts, so a busy machine's pauses do not."""
    sample = _packing_sample(dtype)
    if sample is None:
        return 0.0
    x, w, packed = sample

    def fastest(kernel: Callable[[], Any]) -> float:
        kernel()
        best, t0 = float("inf"), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t1 = time.perf_counter()
            kernel()
            best = min(best, time.perf_counter() - t1)
        return best

    return fastest(lambda: torch.nn.functional.linear(x, w)) / fastest(
        lambda: _packed_linear(x, packed, None)
    )


_ACTIVE: ContextVar[PackedLinears | None] = ContextVar("agentrft_packed_linears", default=None)


class PackableLinear(torch.nn.Linear):
    """`nn.Linear`, except inside `PackedLinears.active()`, where it multiplies by its
    prepacked weight. Training, `generate` and scoring outside the sampler see plain Linear."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        packs = _ACTIVE.get()
        packed = packs.weight_for(self, input) if packs is not None else None
        if packed is None:
            return super().forward(input)
        return _packed_linear(input, packed, self.bias)


class PackedLinears:
    """Prepacked copies of one model's Linear weights (for its sampler, no gradients).

    A weight changed since it was packed is packed again at its next use: an in-place update
    (`copy_`, an optimiser step) bumps its version, and a cast or reload replaces its storage.
    A change made through `.data` bypasses both: call `invalidate()` after one. The copies
    cost as much memory as the weights.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._packed: dict[torch.nn.Module, tuple[tuple[int, int, torch.dtype], torch.Tensor]] = {}
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.__class__ = PackableLinear

    def weight_for(self, module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor | None:
        """`module`'s packed weight, or None where the plain Linear must run (gradients
        wanted, another device or dtype)."""
        w = module.weight
        if (
            torch.is_grad_enabled()
            or input.dtype != w.dtype
            or input.device.type != "cpu"
            or w.device.type != "cpu"
        ):
            return None
        stamp = (w._version, w.data_ptr(), w.dtype)
        entry = self._packed.get(module)
        if entry is None or entry[0] != stamp:
            entry = (stamp, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS))
            self._packed[module] = entry
        return entry[1]

    def invalidate(self) -> None:
        self._packed.clear()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)
