"""The tokens a model sends to tools: in eval results and in the report, beside the
before/after histogram of tool calls per rollout."""

from __future__ import annotations

from agentrft.evaluate.eval import eval_results
from agentrft.evaluate.report import build_report, record_tool_call_tokens
from agentrft.rollout.records import to_record
from agentrft.types import Grade, Group, Item, StopReason, ToolCall, Trajectory, Turn


def rollout(n_calls: int, tokens_per_call: int, answer_tokens: int = 5) -> Trajectory:
    item = Item(0, ({"role": "user", "content": "q"},), {"facts": ["x"]}, "t.jsonl:1")
    turns = [
        Turn(
            i,
            "<tool_call>...",
            tokens_per_call,
            (ToolCall(f"fc_{i}", f"call_{i}", "grep", '{"pattern": "def x"}'),),
        )
        for i in range(n_calls)
    ]
    turns.append(Turn(n_calls, "x", answer_tokens))
    return Trajectory(
        f"trace_{n_calls}", item, (), tuple(turns), (), (), (), StopReason.FINAL_ANSWER
    )


def test_eval_results_count_the_tokens_written_in_tool_calls_only():
    trajs = (rollout(1, 10), rollout(3, 10))
    res = eval_results([Group(trajs[0].item, trajs, (Grade(1.0), Grade(0.5)))])
    assert (
        res["tool_call_tokens"]["mean"] == 20.0 and res["tool_call_tokens"]["max"] == 30.0
    )  # answers are not sent to tools
    assert res["tool_argument_chars"]["max"] == 3 * len('{"pattern": "def x"}')


def test_the_report_shows_tool_tokens_and_the_calls_histogram_before_and_after():
    before = [to_record(rollout(n, 12), Grade(0.5)) for n in (1, 2, 6, 6)]
    after = [to_record(rollout(n, 8), Grade(0.7)) for n in (1, 2, 2, 3)]
    assert record_tool_call_tokens(before[2]) == 72
    page = build_report(before=before, after=after)
    assert "tokens sent to tools mean / p95" in page
    assert 'alt="tool calls per rollout"' in page and "No evaluation results were given" not in page


def test_compare_lists_tokens_sent_to_tools():
    from agentrft.evaluate.measure import compare_rows

    a = {"tool_call_tokens": {"mean": 40.0, "p50": 30.0, "p95": 90.0, "max": 120.0}}
    b = {"tool_call_tokens": {"mean": 20.0, "p50": 18.0, "p95": 30.0, "max": 40.0}}
    rows = {label: (va, vb) for label, va, vb in compare_rows(a, b)}
    assert rows["tokens sent to tools mean"] == (40.0, 20.0) and rows[
        "tokens sent to tools p95"
    ] == (90.0, 30.0)
