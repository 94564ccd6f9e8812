"""The serving scheduler's bookkeeping, without a model: a request cancelled from the event
loop's thread while the decoding thread retires rows is never left half-retired."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agentrft.serve.scheduler import DecodeScheduler, Job


class CancelledWhileRetiring(Job):
    """A job whose client hangs up between the first and the second read of `cancelled`."""

    @property  # type: ignore[override]
    def cancelled(self) -> bool:
        self.reads = getattr(self, "reads", 0) + 1
        return self.reads > 1

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        pass


class Batch:
    def __init__(self) -> None:
        self.retired: list[Any] = []

    def retire(self, rows: list[Any]) -> None:
        self.retired += rows


def test_a_request_cancelled_mid_retire_is_not_orphaned() -> None:
    row = SimpleNamespace(finish_reason=None)
    job = CancelledWhileRetiring([row], lambda events: None)  # type: ignore[list-item]
    batch = Batch()
    running = DecodeScheduler._retire(batch, [job])  # type: ignore[arg-type]
    # either its rows left the batch, or the job is still tracked (and leaves next step);
    # not: rows decoding on in the batch with no job left to retire them
    assert row in batch.retired or job in running, (batch.retired, running)


def test_finished_and_cancelled_rows_leave_and_the_rest_stay() -> None:
    done, live, gone = (SimpleNamespace(finish_reason=f) for f in ("stop", None, None))
    a = Job([done, live], lambda events: None)  # type: ignore[list-item]
    b = Job([gone], lambda events: None, cancelled=True)  # type: ignore[list-item]
    batch = Batch()
    assert DecodeScheduler._retire(batch, [a, b]) == [a]  # type: ignore[arg-type]
    assert batch.retired == [done, gone]
