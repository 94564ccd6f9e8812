"""`dtype: auto`: bf16 only where the hardware computes it natively. The facts (CPU flags,
GPU support, the micro-benchmark's result) are passed in, so these tests do not depend on
the machine that runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrft.job import job_from_dict
from agentrft.policy.precision import choose_dtype, read_cpuinfo, resolve_dtype

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}


def never() -> float:
    raise AssertionError("the benchmark must not run when the flags decide")


def test_explicit_dtype_is_kept_whatever_the_hardware() -> None:
    assert choose_dtype("bf16", "cpu", cpu_flags=AVX2).dtype == "bf16"
    assert choose_dtype("fp32", "cpu", cpu_flags=AVX2 | {"avx512_bf16"}).dtype == "fp32"
    assert choose_dtype("fp32", "cuda", cuda_bf16=True).dtype == "fp32"
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        choose_dtype("fp16", "cpu")


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_auto_picks_bf16_on_a_cpu_with_bf16_units(flag: str) -> None:
    choice = choose_dtype(
        "auto", "cpu", cpu_flags=AVX2 | {"avx512f", flag}, cpu_name="Some Xeon", bf16_speedup=never
    )
    assert choice.dtype == "bf16"
    assert flag in choice.reason and "Some Xeon" in choice.reason


def test_auto_picks_fp32_on_an_avx2_only_cpu() -> None:
    choice = choose_dtype(
        "auto", "cpu", cpu_flags=AVX2 | {"avx512f"}, cpu_name="AMD EPYC", bf16_speedup=never
    )
    assert choice.dtype == "fp32"
    assert "no avx512_bf16" in choice.reason and "AMD EPYC" in choice.reason
    assert str(choice).startswith("fp32 (auto: ")


@pytest.mark.parametrize("value", ["AVX2", "avx512_core", "AVX512_CORE_VNNI"])
def test_a_onednn_isa_cap_below_bf16_overrules_the_flags(value: str) -> None:
    choice = choose_dtype(
        "auto",
        "cpu",
        cpu_flags=AVX2 | {"avx512f", "avx512_bf16"},
        bf16_speedup=never,
        onednn_isa_cap=("ONEDNN_MAX_CPU_ISA", value),
    )
    assert choice.dtype == "fp32"
    assert f"ONEDNN_MAX_CPU_ISA={value}" in choice.reason


def test_a_onednn_isa_cap_that_keeps_bf16_changes_nothing() -> None:
    for value in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", "DEFAULT"):
        choice = choose_dtype(
            "auto",
            "cpu",
            cpu_flags=AVX2 | {"avx512_bf16"},
            bf16_speedup=never,
            onednn_isa_cap=("DNNL_MAX_CPU_ISA", value),
        )
        assert choice.dtype == "bf16", value
    explicit = choose_dtype("bf16", "cpu", onednn_isa_cap=("ONEDNN_MAX_CPU_ISA", "AVX2"))
    assert explicit.dtype == "bf16"  # asked for by name: kept


def test_resolve_dtype_reads_the_isa_cap_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    choice = resolve_dtype("auto", "cpu")
    assert choice.dtype == "fp32" and "ONEDNN_MAX_CPU_ISA=AVX2" in choice.reason


def test_without_flags_the_benchmark_decides() -> None:
    fast = choose_dtype("auto", "cpu", cpu_flags=None, bf16_speedup=lambda: 1.7)
    slow = choose_dtype("auto", "cpu", cpu_flags=None, bf16_speedup=lambda: 0.02)
    assert (fast.dtype, slow.dtype) == ("bf16", "fp32")
    assert "1.70x" in fast.reason and "0.02x" in slow.reason
    assert (
        choose_dtype("auto", "cpu", cpu_flags=None).dtype == "fp32"
    )  # nothing known: the safe choice


def test_auto_on_a_gpu_follows_its_bf16_support() -> None:
    assert choose_dtype("auto", "cuda", cuda_bf16=True).dtype == "bf16"
    assert choose_dtype("auto", "cuda", cuda_bf16=False).dtype == "fp32"


def test_read_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Test CPU @ 2GHz\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nmodel name\t: Test CPU @ 2GHz\nflags\t\t: fpu avx2 avx512_bf16\n"
    )
    assert read_cpuinfo(info) == ("Test CPU @ 2GHz", frozenset({"fpu", "avx2", "avx512_bf16"}))
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert read_cpuinfo(arm) == ("", None)
    assert read_cpuinfo(tmp_path / "missing") == ("", None)


def test_the_job_default_is_auto() -> None:
    job = job_from_dict(
        {
            "training_file": "t.jsonl",
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {
                        "type": "string_check",
                        "name": "g",
                        "input": "{{sample.output_text}}",
                        "reference": "x",
                        "operation": "eq",
                    }
                },
            },
        }
    )
    assert job.agentrft.dtype == "auto"
