"""Measure a job's model around training: K graded rollouts per row (`run_graded`), the
baseline/trained evaluation (`evaluate_model`), the pre-flight (`preflight_job`), a saved
result (`load_result`) and the console tables of a pre-flight and a comparison. The
`agentrft eval | preflight | compare | sample | report` commands (agentrft.cli.evaluate) and
the task runner call these."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrft.errors import AgentRFTError


def _endpoint_model(url: str, name: str | None) -> str:
    """The model to ask an endpoint for: given, or the first one it lists."""
    if name:
        return name
    import httpx

    from agentrft.policy.openai_client import chat_url

    models_url = chat_url(url).removesuffix("/chat/completions") + "/models"
    try:
        listed = httpx.get(models_url, timeout=10).json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise AgentRFTError(
            f"{models_url}: cannot list models ({exc}); name one with --endpoint-model"
        ) from None
    if not listed:
        raise AgentRFTError(f"{models_url} lists no model; name one with --endpoint-model")
    return str(listed[0]["id"])


def job_grader(job: Any) -> Any:
    """The job's grader, built with its judge and sandbox settings."""
    from agentrft.graders import build_grader

    return build_grader(
        job.rl.grader, judge=job.agentrft.judge, python_limits=job.agentrft.sandbox.limits()
    )


def sample_rollouts(
    job: Any,
    items: Sequence[Any],
    k: int,
    model: str | None,
    temperature: float | None,
    env_url: str | None,
    grader: Any,
    *,
    seed: int | None = None,
    label: str = "rollouts",
    endpoint_model: str | None = None,
) -> tuple[list[Any], Any]:
    """K ungraded rollouts per row with `model` on the job's tools (its environment already
    started at `env_url`), and the rollout settings they ran with: the job's model (`base`),
    a run directory or model path, or an OpenAI-compatible endpoint URL. Token-level
    rollouts go through the job's engine (`agentrft.engine`: local, or a vLLM server)."""
    from agentrft.console import progress_bar, show_precision
    from agentrft.runtime import (
        batched_sampler,
        chat_settings_from_job,
        sampling_params,
        settings_from_job,
    )

    ext = job.agentrft
    if model and model.startswith(("http://", "https://")):
        from agentrft.policy.openai_client import OpenAIChat
        from agentrft.rollout.chat_episode import run_chat_groups_async

        chat = OpenAIChat(model, _endpoint_model(model, endpoint_model))
        chat_settings = chat_settings_from_job(job, env_url, grader, temperature)
        with progress_bar(label, len(items) * k) as advance:
            groups = asyncio.run(
                run_chat_groups_async(items, k, chat_settings, chat, on_done=advance)
            )
        return groups, chat_settings
    from agentrft.engine import choose_engine
    from agentrft.policy.load import load_policy
    from agentrft.rollout.group import rollout_groups

    if choose_engine(ext.engine, ext.device)[0] == "vllm":
        import tempfile

        from agentrft.engine import eval_engine

        with (
            tempfile.TemporaryDirectory(prefix="agentrft-engine-") as work,
            eval_engine(job, model, Path(work)) as (engine, served),
        ):
            settings = settings_from_job(job, served, env_url, grader)
            params = sampling_params(
                job, seed=job.seed if seed is None else seed, temperature=temperature
            )
            sampler = engine.sampler(params, ext.sampling.max_batch, ext.sampling.kv_cache_mb)
            with progress_bar(f"{label} (vLLM engine)", len(items) * k) as advance:
                groups, _ = rollout_groups(items, k, settings, sampler, advance)
        return groups, settings

    policy = load_policy(
        job.model if model in (None, "base") else model,
        base=job.model,
        device=ext.device,
        dtype=ext.dtype,
    )
    show_precision(policy.precision)
    settings = settings_from_job(job, policy, env_url, grader)
    params = sampling_params(job, seed=job.seed if seed is None else seed, temperature=temperature)
    sampler = batched_sampler(job, policy, params)
    with progress_bar(label, len(items) * k) as advance:
        groups, _ = rollout_groups(items, k, settings, sampler, advance)
    return groups, settings


def run_graded(
    job: Any,
    items: Sequence[Any],
    k: int,
    model: str | None,
    temperature: float | None,
    seed: int | None = None,
    label: str = "rollouts",
    endpoint_model: str | None = None,
) -> list[Any]:
    """K graded rollouts per row with `model` (see `sample_rollouts`). Rollouts come from
    `rollout/` and grades from `graders/`, as in training."""
    from agentrft.graders import grade_rollouts
    from agentrft.runtime import job_environment

    grader = job_grader(job)
    with job_environment(job) as env_url:
        groups, _ = sample_rollouts(
            job,
            items,
            k,
            model,
            temperature,
            env_url,
            grader,
            seed=seed,
            label=label,
            endpoint_model=endpoint_model,
        )
        graded, _ = grade_rollouts(groups, grader, env_url)
    return graded


def evaluate_model(
    job: Any,
    items: Sequence[Any],
    k: int,
    model: str,
    out: Path,
    *,
    temperature: float | None = None,
    threshold: float = 1.0,
    endpoint_model: str | None = None,
    label: str = "eval",
) -> dict[str, Any]:
    """Run and grade K rollouts per row with `model`; write results.json and rollouts.jsonl
    to `out` and return the results."""
    from agentrft.evaluate.eval import eval_results, graded_records
    from agentrft.rollout.records import finite, write_jsonl

    t0 = time.perf_counter()
    groups = run_graded(
        job, items, k, model, temperature, label=label, endpoint_model=endpoint_model
    )
    res = eval_results(groups, threshold)
    res.update(
        {
            "model": model,
            "job": job.source,
            "k": k,
            "rows": len(items),
            "wall_s": time.perf_counter() - t0,
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(finite(res), indent=2))
    write_jsonl(out / "rollouts.jsonl", graded_records(groups))
    return res


def preflight_job(
    job: Any,
    items: Sequence[Any],
    k: int,
    out: Path,
    *,
    model: str | None = None,
    temperature: float | None = None,
    threshold: float = 1.0,
) -> dict[str, Any]:
    """The learnability check on `items`; writes preflight.json and rollouts.jsonl."""
    require(k >= 2, "preflight needs -k 2 or more: signal means rewards that differ across samples")
    groups = run_graded(job, items, k, model, temperature, label="preflight")
    return write_preflight(groups, k, out, threshold)


def write_preflight(
    groups: Sequence[Any], k: int, out: Path, threshold: float = 1.0
) -> dict[str, Any]:
    """The pre-flight's report on graded groups of K rollouts; writes out/preflight.json and
    out/rollouts.jsonl (the doctor calls it on its own base rollouts, which are the same kind)."""
    from agentrft.evaluate.eval import graded_records
    from agentrft.evaluate.preflight import preflight
    from agentrft.rollout.records import finite, write_jsonl

    rep = preflight(groups, [x for x in (1, 2, 4, 8, 16, 32) if x <= k], threshold)
    out.mkdir(parents=True, exist_ok=True)
    (out / "preflight.json").write_text(json.dumps(finite(rep), indent=2))
    write_jsonl(out / "rollouts.jsonl", graded_records(groups))
    return rep


def print_preflight(rep: dict[str, Any]) -> None:
    from rich.table import Table

    from agentrft.console import console, summary_table

    console.print(summary_table(rep["eval"], title="rollouts"))
    t = Table(title="learnability", header_style="bold")
    t.add_column("k", justify="right")
    t.add_column("best-of-k reward", justify="right")
    t.add_column(f"pass@k (reward >= {rep['threshold']:g})", justify="right")
    for k in rep["best_of_k"]:
        t.add_row(k, f"{rep['best_of_k'][k]:.3f}", f"{rep['pass_at_k'].get(k, float('nan')):.3f}")
    console.print(t)
    console.print(
        f"rows whose {rep['samples_per_row']} rewards differ: {rep['rows_with_signal']:.0%}   rewards {rep['reward_min']:.3g} .. {rep['reward_max']:.3g}   histogram {rep['eval']['reward_histogram']}"
    )
    style = {"learnable": "bold green", "weak_signal": "bold yellow"}.get(
        rep["verdict"], "bold red"
    )
    console.print(f"verdict: [{style}]{rep['verdict']}[/]")
    for line in rep["advice"]:
        console.print(f"  - {line}")


def load_result(path: str) -> dict[str, Any]:
    """An eval result: a directory holding results.json (+ rollouts.jsonl), or the JSON file."""
    from agentrft.rollout.records import read_jsonl

    p = Path(path)
    res_path = p / "results.json" if p.is_dir() else p
    require(
        res_path.is_file(),
        f"{path}: no results.json here (give an `agentrft eval` output directory or its results.json)",
    )
    summary = json.loads(res_path.read_text())
    rollouts = res_path.parent / "rollouts.jsonl"
    return {
        "summary": summary,
        "rollouts": read_jsonl(rollouts) if rollouts.is_file() else [],
        "label": str(path),
    }


def compare_rows(
    a: dict[str, Any], b: dict[str, Any]
) -> list[tuple[str, float | None, float | None]]:
    """(metric, A, B) for the side-by-side table."""

    def get(d: dict[str, Any], *keys: str) -> float | None:
        for k in keys:
            d = d.get(k) if isinstance(d, dict) else None  # type: ignore[assignment]
        return float(d) if isinstance(d, int | float) else None

    rows = [("reward mean", ("reward", "mean")), ("pass rate", ("pass_rate",))]
    subs = sorted(set(a.get("sub_rewards", {})) | set(b.get("sub_rewards", {})))
    rows += [(f"  {s}", ("sub_rewards", s)) for s in subs]
    for key, label in (
        ("tool_calls", "tool calls"),
        ("turns", "turns"),
        ("sampled_tokens", "sampled tokens"),
        ("tool_call_tokens", "tokens sent to tools"),
        ("latency_s", "latency s"),
    ):
        rows += [(f"{label} {q}", (key, q)) for q in ("mean", "p50", "p95", "max")]
    tools = sorted(set(a.get("tool_calls_per_tool", {})) | set(b.get("tool_calls_per_tool", {})))
    rows += [(f"calls to {t} (total)", ("tool_calls_per_tool", t)) for t in tools]
    rows += [
        ("bytes sent to tools", ("tool_request_bytes",)),
        ("invalid tool calls", ("invalid_tool_calls",)),
        ("discard rate", ("discard_rate",)),
        ("grader error rate", ("grader_error_rate",)),
    ]
    return [(label, get(a, *keys), get(b, *keys)) for label, keys in rows]


def print_compare(a: dict[str, Any], b: dict[str, Any], label_a: str, label_b: str) -> None:
    """Two eval summaries side by side, and their tool-call distributions."""
    from rich.table import Table

    from agentrft.console import console

    t = Table(title=f"compare: A = {label_a}   B = {label_b}", header_style="bold")
    for col in ("metric", "A", "B", "B - A"):
        t.add_column(col, justify="left" if col == "metric" else "right")

    def fmt(v: float | None) -> str:
        return "-" if v is None else (f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}")

    for label, va, vb in compare_rows(a, b):
        t.add_row(label, fmt(va), fmt(vb), "-" if va is None or vb is None else f"{vb - va:+.3f}")
    console.print(t)
    hist = Table(title="tool calls per rollout (share of rollouts)", header_style="bold")
    for col in ("calls", "A", "B"):
        hist.add_column(col, justify="right")
    ha = {int(k): v for k, v in a.get("tool_calls_histogram", {}).items()}
    hb = {int(k): v for k, v in b.get("tool_calls_histogram", {}).items()}
    na, nb = max(1, sum(ha.values())), max(1, sum(hb.values()))
    for n in sorted(set(ha) | set(hb)):
        hist.add_row(str(n), f"{ha.get(n, 0) / na:.0%}", f"{hb.get(n, 0) / nb:.0%}")
    console.print(hist)


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise AgentRFTError(msg)
