"""The run report: one self-contained HTML page (plots inlined as base64 PNGs, inline CSS,
no scripts, nothing fetched) that a person opens after training or attaches to an issue.

Everything it reads is plain data, as written to disk:
- `metrics`: rows of `metrics.jsonl`, one dict per step. The x axis is `step` (else the
  row's position); every key that holds a reward (`is_reward_key`: means, sub-grader
  means; not `reward/n` or `reward/std`) is a curve on the reward axis.
- `before` / `after`: evaluation results for the base and the trained model. Either a list
  of rollout records (`agentrft.rollout.records.to_record` dicts, i.e. rows of
  `rollouts.jsonl`), or a dict holding some of `"rollouts"` (such records), `"summary"`
  (`records.summarize` output) and `"best_of_k"` ({k: value}).
- `rollouts`: rollout records to show as conversations; the best and the worst by reward
  come first.
- `doctor`: a doctor.json (`agentrft doctor`); `run_dir`: the training run whose hack-watch
  flags (hack_watch.jsonl) and per-step readings (readings/step-N.html) are shown and linked.

Sections whose data is missing say so instead of disappearing. matplotlib is imported only
when a plot is drawn, and never through pyplot (no global state, no display needed).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrft.evaluate.estimators import best_of_k_curve, rewards_by_prompt
from agentrft.evaluate.report_checks import doctor_html, hack_flags, hack_watch_html, reading_pages
from agentrft.rollout.records import distribution

Record = Mapping[str, Any]
MAX_CHARS = 4000  # per message shown; the rest is cut with a note
CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:24px;color:#1d2330;background:#fafbfc}
h1{font-size:26px;margin:0 0 4px} h2{font-size:20px;margin:0 0 12px;border-bottom:1px solid #d8dde6;padding-bottom:6px}
section{background:#fff;border:1px solid #e1e5ec;border-radius:8px;padding:18px 22px;margin:18px 0}
img{max-width:100%;height:auto} .missing{color:#8a93a3;font-style:italic}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #e1e5ec;padding:4px 12px;text-align:right} th:first-child,td:first-child{text-align:left}
.traj{border:1px solid #e1e5ec;border-radius:8px;margin:14px 0;padding:10px 14px}
.traj h3{font-size:15px;margin:0 0 8px;font-weight:600} .meta{color:#5b6475;font-weight:400}
.msg{border-left:4px solid #c9ced8;margin:8px 0;padding:4px 10px;background:#f6f7f9}
.msg .role{font-size:12px;font-weight:700;text-transform:uppercase;letter-spacing:.04em;color:#5b6475}
.role-user{border-color:#3b82f6}.role-assistant{border-color:#16a34a}.role-tool{border-color:#d97706}.role-system{border-color:#9ca3af}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre.call{background:#eef6ee;padding:4px 6px;border-radius:4px}
"""


# -- plots -----------------------------------------------------------------------------
def _figure(width: float = 7.5, height: float = 3.4) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def png_base64(fig: Any) -> str:
    """A matplotlib Figure as a base64 PNG (Agg canvas, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def is_reward_key(key: str) -> bool:
    """Whether a metrics key holds a reward: the mean reward (training, `eval/...`), a
    sub-grader's mean, or a key named plainly `reward`. Counts, spreads and histograms
    carry "reward" in their names too (`reward/n` is the number of graded rollouts, 16 and
    more): on the reward axis they flattened every real curve to the bottom."""
    last = key.rsplit("/", 1)[-1]
    return (
        last == "reward"
        or key.endswith("reward/mean")
        or key.startswith(("sub_rewards/", "eval/sub_rewards/"))
    )


def reward_curves(
    metrics: Sequence[Record], max_curves: int = 6
) -> dict[str, list[tuple[float, float]]]:
    """(step, reward) points per reward key (`is_reward_key`), the overall means first."""
    keys = sorted(
        {k for row in metrics for k, v in row.items() if is_reward_key(k) and _number(v)},
        key=lambda k: (not k.endswith("reward/mean"), k),
    )
    return {
        key: [
            (row.get("step", i), row[key]) for i, row in enumerate(metrics) if _number(row.get(key))
        ]
        for key in keys[:max_curves]
    }


def reward_curve_png(metrics: Sequence[Record], max_curves: int = 6) -> str | None:
    """The reward curves of the metrics rows against `step` (one quantity on the axis:
    rewards); None without any."""
    curves = reward_curves(metrics, max_curves)
    if not curves:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for key, points in curves.items():
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o" if len(points) < 30 else None,
            markersize=3,
            label=key,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png_base64(fig)


def tool_calls_png(before: Mapping[int, int], after: Mapping[int, int]) -> str | None:
    """Two histograms side by side: rollouts per number of tool calls, before and after."""
    if not before and not after:
        return None
    fig = _figure(8.5, 3.2)
    top = max([*before, *after, 0])
    share_y = max([*before.values(), *after.values(), 1])
    for i, (label, counts, color) in enumerate(
        [("before", before, "#6b7280"), ("after", after, "#16a34a")]
    ):
        ax = fig.add_subplot(1, 2, i + 1)
        xs = list(range(top + 1))
        ax.bar(xs, [counts.get(x, 0) for x in xs], color=color, width=0.8)
        ax.set_title(
            f"{label} ({sum(counts.values())} rollouts)" if counts else f"{label}: no data",
            fontsize=10,
        )
        ax.set_xlabel("tool calls per rollout")
        ax.set_ylim(0, share_y * 1.1)
        ax.set_xticks(xs if top < 16 else xs[:: max(1, top // 10)])
        ax.grid(axis="y", alpha=0.3)
    fig.axes[0].set_ylabel("rollouts")
    return png_base64(fig)


def best_of_k_png(curves: Mapping[str, Mapping[int, float]]) -> str | None:
    """Expected best reward of k samples against k, one line per model."""
    curves = {label: c for label, c in curves.items() if c}
    if not curves:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for label, curve in curves.items():
        ks = sorted(curve)
        ax.plot(ks, [curve[k] for k in ks], marker="o", markersize=3, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("expected best reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png_base64(fig)


# -- reading evaluation results ---------------------------------------------------------
def _records(data: Any) -> list[Record]:
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return [r for r in data if isinstance(r, Mapping)]
    if isinstance(data, Mapping) and isinstance(data.get("rollouts"), Sequence):
        return [r for r in data["rollouts"] if isinstance(r, Mapping)]
    return []


def _summary(data: Any) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        if isinstance(data.get("summary"), Mapping):
            return data["summary"]
        if "tool_calls_histogram" in data:
            return data
    return {}


def tool_call_counts(data: Any) -> dict[int, int]:
    """Rollouts per number of tool calls (kept rollouts only), from records or a summary."""
    records = _records(data)
    if records:
        return dict(
            Counter(int(r.get("num_tool_calls", 0)) for r in records if not r.get("discarded"))
        )
    hist = _summary(data).get("tool_calls_histogram") or {}
    return {int(k): int(v) for k, v in hist.items()}


def best_of_k_from(data: Any) -> dict[int, float]:
    """The best-of-k curve: estimated from records with several samples per row, else the
    result's own `best_of_k`."""
    groups = [g for g in rewards_by_prompt(_records(data)) if len(g) >= 2]
    if groups:
        return best_of_k_curve(groups)
    given = data.get("best_of_k") if isinstance(data, Mapping) else None
    return {int(k): float(v) for k, v in (given or {}).items()}


def record_tool_call_tokens(record: Record) -> int:
    """Tokens the model wrote in the replies that call tools, from a rollout record (see
    `agentrft.evaluate.eval.tool_call_tokens`)."""
    return sum(
        int(t.get("sampled_tokens") or 0) for t in record.get("turns") or [] if t.get("tool_calls")
    )


def _overview(data: Any) -> dict[str, str]:
    records, summary = _records(data), _summary(data)
    kept = [r for r in records if not r.get("discarded")]
    if not records and not summary:
        return {}
    rewards = [float(r["reward"]) for r in kept if _number(r.get("reward"))]

    def spread(value: Callable[[Record], float], summary_key: str) -> Mapping[str, float]:
        """`value` over the kept records, or the summary's figures where there are none."""
        return distribution([value(r) for r in kept]) if records else summary.get(summary_key, {})

    calls = spread(lambda r: float(r.get("num_tool_calls", 0)), "tool_calls")
    tokens = spread(lambda r: float((r.get("tokens") or {}).get("sampled", 0)), "sampled_tokens")
    call_tokens = spread(lambda r: float(record_tool_call_tokens(r)), "tool_call_tokens")
    latency = spread(lambda r: float((r.get("timings") or {}).get("total_s", 0.0)), "latency_s")
    reward = summary.get("reward", {}).get("mean") if not rewards else sum(rewards) / len(rewards)

    def fmt(d: Mapping[str, float], key: str, spec: str = "{:.2f}") -> str:
        return spec.format(d[key]) if _number(d.get(key)) else "-"

    return {
        "rollouts (discarded)": f"{len(records) or summary.get('rollouts', 0)} ({len(records) - len(kept) if records else summary.get('discarded', 0)})",
        "mean reward": f"{reward:.3f}" if _number(reward) else "-",
        "tool calls mean / p50 / p95 / max": " / ".join(
            fmt(calls, k) for k in ("mean", "p50", "p95", "max")
        ),
        "sampled tokens mean / p95": f"{fmt(tokens, 'mean', '{:.0f}')} / {fmt(tokens, 'p95', '{:.0f}')}",
        "tokens sent to tools mean / p95": f"{fmt(call_tokens, 'mean', '{:.1f}')} / {fmt(call_tokens, 'p95', '{:.0f}')}",
        "latency s p50 / p95": f"{fmt(latency, 'p50')} / {fmt(latency, 'p95')}",
    }


# -- HTML ------------------------------------------------------------------------------
def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def image_html(b64: str | None, alt: str, missing: str) -> str:
    if b64 is None:
        return f'<p class="missing">{escape(missing)}</p>'
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{b64}">'


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + f"\n… [{len(text) - MAX_CHARS} more characters]"
    return f"<pre>{escape(text)}</pre>"


def _message(m: Record) -> str:
    role = str(m.get("role", "?"))
    head = f"tool · {m['name']}" if role == "tool" and m.get("name") else role
    calls = "".join(
        f'<pre class="call">→ {escape(c.get("function", {}).get("name", ""))}({escape(c.get("function", {}).get("arguments", ""))})</pre>'
        for c in m.get("tool_calls") or []
        if isinstance(c, Mapping)
    )
    return f'<div class="msg role-{escape(role)}"><div class="role">{escape(head)}</div>{_text(m.get("content"))}{calls}</div>'


def trajectory_html(record: Record) -> str:
    """One rollout as a conversation: the prompt folded away except the last request, then
    every reply with its tool calls and the tool outputs."""
    messages = [m for m in record.get("messages") or [] if isinstance(m, Mapping)]
    written = sum(1 + len(t.get("tool_results") or []) for t in record.get("turns") or [])
    prompt, rest = messages[: len(messages) - written], messages[len(messages) - written :]
    reward = record.get("reward")
    meta = [
        f"row {record.get('row', '?')}",
        f"reward {reward:.3f}" if _number(reward) else "ungraded",
        f"stop {record.get('stop_reason', '?')}",
        f"{record.get('num_tool_calls', 0)} tool calls",
    ]
    if record.get("discarded"):
        meta.append(f"DISCARDED: {record['discarded']}")
    folded = ""
    if len(prompt) > 1:
        folded = f"<details><summary>prompt: {len(prompt) - 1} earlier messages (system, examples)</summary>{''.join(_message(m) for m in prompt[:-1])}</details>"
    body = folded + "".join(_message(m) for m in prompt[-1:] + rest)
    return f'<div class="traj"><h3>{escape(record.get("trace_id", "rollout"))} <span class="meta">· {escape(" · ".join(meta))}</span></h3>{body}</div>'


def _pick(records: Sequence[Record], n: int) -> list[Record]:
    """The best and the worst graded rollout first, then the others in their order."""
    graded = sorted(
        (r for r in records if _number(r.get("reward"))), key=lambda r: float(r["reward"])
    )
    out: list[Record] = []
    for r in [*graded[-1:], *graded[:1], *records]:
        if all(r is not u for u in out):
            out.append(r)
    return out[:n]


def _overview_table(before: Any, after: Any) -> str:
    cols = {label: _overview(data) for label, data in (("before", before), ("after", after))}
    cols = {label: col for label, col in cols.items() if col}
    if not cols:
        return ""
    keys = list(next(iter(cols.values())))
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    rows = "".join(
        f"<tr><td>{escape(k)}</td>"
        + "".join(f"<td>{escape(cols[c].get(k, '-'))}</td>" for c in cols)
        + "</tr>"
        for k in keys
    )
    return f"<table><tr><th></th>{head}</tr>{rows}</table>"


PIPELINE_COLUMNS = (  # (metrics key, heading, format)
    ("time/step_s", "step s", "{:.1f}"),
    ("time/trainer_idle_share", "trainer idle", "{:.0%}"),
    ("engine/busy_share", "engine busy", "{:.0%}"),
    ("async/staleness", "staleness", "{:.0f}"),
    ("async/off_policy_rollouts", "off-policy (importance-weighted)", "{:.0f}"),
    ("async/dropped_stale", "dropped as stale", "{:.0f}"),
    ("async/finished_on_old_version", "finished on the old version", "{:.0f}"),
)


def pipeline_html(metrics: Sequence[Record], last: int = 30) -> str:
    """The steps' timing and staleness (async steps, `train/async_steps.py`): how long each
    step took, the share of it the update waited, and how stale its rollouts were."""
    rows = [m for m in metrics if m.get("step", 0) > 0 and _number(m.get("time/step_s"))]
    if not rows:
        return '<p class="missing">No training step has finished yet.</p>'
    columns = [c for c in PIPELINE_COLUMNS if any(_number(_pipeline_value(m, c[0])) for m in rows)]
    head = "<th>step</th>" + "".join(f"<th>{escape(h)}</th>" for _, h, _ in columns)
    body = "".join(
        f"<tr><td>{m['step']}</td>"
        + "".join(
            f"<td>{fmt.format(v) if _number(v := _pipeline_value(m, key)) else '-'}</td>"
            for key, _, fmt in columns
        )
        + "</tr>"
        for m in rows[-last:]
    )
    note = f"<p>the last {last} of {len(rows)} steps</p>" if len(rows) > last else ""
    return f"{note}<table><tr>{head}</tr>{body}</table>"


def _pipeline_value(m: Record, key: str) -> Any:
    if key == "time/trainer_idle_share" and key not in m:  # synchronous runs: seconds
        idle: Any = m.get("time/trainer_idle_s")
        step: Any = m.get("time/step_s")
        return idle / step if _number(idle) and _number(step) and step > 0 else None
    return m.get(key)


def build_report(
    *,
    metrics: Sequence[Record] | None = None,
    before: Any = None,
    after: Any = None,
    rollouts: Sequence[Record] | None = None,
    title: str = "agentrft report",
    max_trajectories: int = 4,
    doctor: Mapping[str, Any] | None = None,
    flags: Sequence[Record] = (),
    reading_links: Mapping[int, str] | None = None,
) -> str:
    """The whole page as a string (see the module docstring for the inputs; `doctor`: a
    doctor.json, `flags`: hack_watch.jsonl rows, `reading_links`: step -> link to the
    step's readings page)."""
    counts_before, counts_after = tool_call_counts(before), tool_call_counts(after)
    sections = [
        ("doctor", "Doctor: the job checked before training", doctor_html(doctor)),
        (
            "reward-curve",
            "Reward during training",
            image_html(
                reward_curve_png(metrics or []),
                "reward curve",
                "No training metrics with a reward (metrics.jsonl) were given.",
            ),
        ),
        (
            "hack-watch",
            "Hack watch",
            hack_watch_html(metrics or [], flags, reading_links or {}),
        ),
        ("pipeline", "Steps: time, trainer idle and staleness", pipeline_html(metrics or [])),
        (
            "tool-calls",
            "Tool calls per rollout, before and after",
            _overview_table(before, after)
            + image_html(
                tool_calls_png(counts_before, counts_after),
                "tool calls per rollout",
                "No evaluation results were given.",
            ),
        ),
        (
            "best-of-k",
            "Best of k",
            image_html(
                best_of_k_png({"before": best_of_k_from(before), "after": best_of_k_from(after)}),
                "best-of-k curve",
                "No evaluation with several samples per prompt was given.",
            ),
        ),
        (
            "trajectories",
            "Trajectories",
            "".join(trajectory_html(r) for r in _pick(list(rollouts or []), max_trajectories))
            or '<p class="missing">No rollouts were given.</p>',
        ),
    ]
    return page(title, sections)


def page(title: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """A self-contained page of (id, heading, HTML) sections."""
    body = "".join(
        f'<section id="{sid}"><h2>{escape(head)}</h2>{content}</section>'
        for sid, head, content in sections
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def readings_page(step: int, picks: Sequence[tuple[str, Record]]) -> str:
    """A training step's rollouts chosen for reading (the hack watch writes one per step)."""
    return page(
        f"step {step}: rollouts to read",
        [(label, f"{label} rollout", trajectory_html(r)) for label, r in picks],
    )


def write_report(
    out_path: str | Path,
    *,
    metrics: Sequence[Record] | None = None,
    before: Any = None,
    after: Any = None,
    rollouts: Sequence[Record] | None = None,
    title: str = "agentrft report",
    max_trajectories: int = 4,
    doctor: Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
) -> Path:
    """Write the report page to `out_path` and return it. `run_dir`: the training run whose
    hack-watch flags and readings the page shows (linked relative to the page)."""
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        build_report(
            metrics=metrics,
            before=before,
            after=after,
            rollouts=rollouts,
            title=title,
            max_trajectories=max_trajectories,
            doctor=doctor,
            flags=hack_flags(run_dir),
            reading_links=reading_pages(run_dir, path.parent),
        ),
        encoding="utf-8",
    )
    return path
