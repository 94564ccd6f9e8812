"""Which precision to sample and train in: `dtype: auto` picks bf16 only where the hardware
computes it natively, fp32 everywhere else.

Why this matters: bf16 on a CPU with bf16 matrix units (avx512_bf16, amx_bf16) was about 1.6x
faster than fp32 for training; on an AVX2-only CPU a bf16 matmul is emulated and ran about
65x *slower* than fp32. So the default cannot be fixed, and every run says what it chose.

    choose_dtype(...)   the decision, from facts passed in (unit-tested without this machine)
    resolve_dtype(...)  the same decision with the facts read from this machine
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Dtype = Literal["fp32", "bf16"]
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 CPU flags of native bf16 matrix arithmetic
MIN_BF16_SPEEDUP = 1.0  # the micro-benchmark picks bf16 only when it is at least as fast as fp32


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
) -> DtypeChoice:
    """The precision for `requested` ("auto", "bf16" or "fp32") on `device_type` ("cpu", "cuda").

    On a CPU the flags decide when they are known (x86 Linux): bf16 with avx512_bf16 or
    amx_bf16, fp32 without. Where they are not (other systems, ARM), `bf16_speedup()`, a
    micro-benchmark's bf16/fp32 throughput ratio, decides; without one, fp32.
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
    import torch

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


def resolve_dtype(requested: str, device_type: str) -> DtypeChoice:
    """`choose_dtype` with this machine's facts: /proc/cpuinfo, the GPU, and the
    micro-benchmark where the flags say nothing."""
    if requested != "auto":
        return choose_dtype(requested, device_type)
    if device_type == "cuda":
        import torch

        return choose_dtype(requested, device_type, cuda_bf16=torch.cuda.is_bf16_supported())
    name, flags = read_cpuinfo()
    return choose_dtype(
        requested, device_type, cpu_flags=flags, cpu_name=name, bf16_speedup=measured_bf16_speedup
    )
