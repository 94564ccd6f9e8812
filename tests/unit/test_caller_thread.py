"""`rollout.caller_thread`: the model's calls run on the thread that started the rollouts, the
event loop beside it; results, errors and interrupts cross between the two intact."""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading
import time

import pytest

from agentrft.policy import Completion, SamplingParams
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.caller_thread import on_caller, run_with_caller


def test_calls_run_on_the_caller_and_the_loop_beside_it() -> None:
    caller = threading.get_ident()

    async def work() -> tuple[int, list[int]]:
        loop_thread = threading.get_ident()
        ran_on = await asyncio.gather(*(on_caller(threading.get_ident) for _ in range(5)))
        return loop_thread, ran_on

    loop_thread, ran_on = run_with_caller(work())
    assert loop_thread != caller
    assert ran_on == [caller] * 5


def test_outside_run_with_caller_a_worker_thread_runs_the_call() -> None:
    async def work() -> tuple[int, int]:
        return threading.get_ident(), await on_caller(threading.get_ident)

    loop_thread, ran_on = asyncio.run(work())
    assert ran_on != loop_thread  # the event loop is never blocked by the call


def test_arguments_results_and_errors_cross_intact() -> None:
    def divide(a: int, b: int = 1) -> float:
        return a / b

    async def work() -> tuple[float, str]:
        ok = await on_caller(divide, 6, b=3)
        try:
            await on_caller(divide, 1, b=0)
        except ZeroDivisionError as exc:
            return ok, type(exc).__name__
        return ok, "no error"

    assert run_with_caller(work()) == (2.0, "ZeroDivisionError")


def test_an_error_in_the_coroutine_is_raised_to_the_caller() -> None:
    async def work() -> None:
        await on_caller(lambda: None)
        raise ValueError("episode failed")

    with pytest.raises(ValueError, match="episode failed"):
        run_with_caller(work())
    assert [t.name for t in threading.enumerate()].count("agentrft-rollouts") == 0


def test_the_loop_keeps_running_while_the_caller_works() -> None:
    """While the caller is inside a call, other coroutines (HTTP tool calls) go on: here the
    call can only return once a coroutine on the loop has run."""
    released = threading.Event()

    async def release_later() -> None:
        for _ in range(3):
            await asyncio.sleep(0.01)
        released.set()

    async def work() -> list[bool | None]:
        return await asyncio.gather(on_caller(released.wait, 30), release_later())

    assert run_with_caller(work()) == [True, None]


def test_ctrl_c_on_the_caller_cancels_the_rollouts_and_propagates() -> None:
    cancelled = threading.Event()

    def interrupted() -> None:
        _thread.interrupt_main()  # a SIGINT-like KeyboardInterrupt in the caller
        time.sleep(0.2)

    async def work() -> None:
        try:
            await on_caller(interrupted)
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    t0 = time.perf_counter()
    # Python's own SIGINT handler, whatever an earlier test (a server, a CLI) left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_with_caller(work())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cancelled.is_set() and time.perf_counter() - t0 < 5
    assert [t.name for t in threading.enumerate()].count("agentrft-rollouts") == 0


class _ThreadRecordingPolicy:
    def __init__(self) -> None:
        self.threads: set[int] = set()

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        max_tokens: list[int] | None = None,
        seeds: list[int] | None = None,
    ) -> list[Completion]:
        self.threads.add(threading.get_ident())
        return [Completion((1,), (-0.1,), "stop") for _ in prompts]


def test_the_batched_sampler_samples_on_the_caller_under_run_with_caller() -> None:
    policy = _ThreadRecordingPolicy()
    sampler = BatchedSampler(policy, SamplingParams(max_tokens=4))  # type: ignore[arg-type]  # duck-typed

    async def work() -> list[Completion]:
        try:
            return await asyncio.gather(*(sampler.sample([1, 2], 4) for _ in range(6)))
        finally:
            await sampler.aclose()

    out = run_with_caller(work())
    assert len(out) == 6 and policy.threads == {threading.get_ident()}
