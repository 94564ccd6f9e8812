"""Terminal output: summary tables and readable trajectories (rich)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentrft.types import Trajectory

console = Console(stderr=False)
_lock = threading.Lock()

_ROLE_STYLE = {"system": "dim", "user": "bold cyan", "assistant": "bold green", "tool": "yellow"}


def show_trajectory(traj: Trajectory, reward: float | None = None, max_chars: int = 1200) -> None:
    title = f"{traj.trace_id}  row {traj.item.index}  stop={traj.stop_reason.value}"
    if reward is not None:
        title += f"  reward={reward:.3f}"
    if traj.discarded:
        title += f"  DISCARDED: {traj.discarded}"
    show_messages(traj.messages, title, max_chars)


def show_messages(messages: Sequence[Mapping[str, Any]], title: str, max_chars: int = 1200) -> None:
    """A conversation as one panel: each message's role, then its (clipped) content."""
    parts: list[Any] = []
    for m in messages:
        role = m["role"]
        body = str(m.get("content") or "")
        if len(body) > max_chars:
            body = body[:max_chars] + f" ... [{len(body) - max_chars} more chars]"
        head = role if role != "tool" else f"tool ({m.get('name', '')})"
        parts.append(Text(f"[{head}]", style=_ROLE_STYLE.get(role, "")))
        parts.append(Text(body + "\n"))
    console.print(
        Panel(Text.assemble(*[(p.plain + "\n", p.style) for p in parts]), title=title, expand=True)
    )


def summary_table(summary: dict[str, Any], title: str = "rollouts") -> Table:
    """Rollout statistics (`rollout.records.summarize`), with rewards when graded
    (`evaluate.eval.eval_results`)."""
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")

    def dist(d: dict[str, float], fmt: str = "{:.2f}") -> str:
        return "  ".join(f"{k} {fmt.format(v)}" for k, v in d.items())

    rows: list[tuple[str, str]] = [
        ("rollouts (discarded)", f"{summary['rollouts']} ({summary['discarded']})")
    ]
    if "reward" in summary:
        r = summary["reward"]
        rows.append(("reward mean ± std", f"{r['mean']:.3f} ± {r['std']:.3f}  (n={r['n']})"))
        rows += [(f"  {k}", f"{v:.3f}") for k, v in summary.get("sub_rewards", {}).items()]
        if "pass_rate" in summary:
            rows.append(
                (
                    f"pass rate (reward >= {summary['pass_threshold']:g})",
                    f"{summary['pass_rate']:.3f}",
                )
            )
        if summary.get("grader_errors"):
            rows.append(
                (
                    "grader errors",
                    ", ".join(f"{k}: {v}" for k, v in summary["grader_errors"].items()),
                )
            )
    rows += [
        ("stop reasons", ", ".join(f"{k}: {v}" for k, v in summary["stop_reasons"].items())),
        ("tool calls / rollout", dist(summary["tool_calls"])),
        (
            "tool calls by tool",
            ", ".join(f"{k}: {v}" for k, v in summary["tool_calls_per_tool"].items()) or "-",
        ),
        (
            "invalid calls / tool errors",
            f"{summary['invalid_tool_calls']} / {summary['tool_errors']}",
        ),
        ("turns / rollout", dist(summary["turns"])),
        ("sampled tokens / rollout", dist(summary["sampled_tokens"], "{:.0f}")),
        ("tool latency s", dist(summary["tool_latency_s"], "{:.3f}")),
        ("rollout latency s", dist(summary["latency_s"], "{:.1f}")),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def show_precision(choice: Any) -> None:
    """The dtype a run samples (and trains) in, and why: `dtype: auto` depends on the
    hardware, so every run, eval and server says what it chose."""
    console.print(f"precision: {choice}")


_shared: dict[str, Any] = {}  # the progress display open now, and how many bars it shows


@contextlib.contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[..., None]]:
    """A transient progress bar; yields a callback that advances it by one (any arguments
    are ignored, so it can be passed straight as an `on_done` hook). Bars open at the same
    time (async steps, an eval while rollouts run) share one display, since the terminal
    holds one live display at a time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with _lock:
        if not _shared:
            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            progress.start()
            _shared.update(progress=progress, bars=0)
        progress = _shared["progress"]
        _shared["bars"] += 1
        task = progress.add_task(label, total=total)
    try:
        yield lambda *_: progress.advance(task)
    finally:
        with _lock:
            progress.remove_task(task)
            _shared["bars"] -= 1
            if not _shared["bars"]:
                progress.stop()
                _shared.clear()
