"""Run a rollout's event loop beside the calling thread, and the model's work on the caller.

Rollouts are asyncio code (episodes, HTTP tool calls, a batching worker), while sampling is
a blocking torch call. Handing that call to a worker thread (`asyncio.to_thread`) made it
slow on CPU: torch's kernels run on OpenMP, GNU OpenMP keeps one thread team per thread that
starts parallel work, and once the teams' threads outnumber the cores it stops spinning
between parallel regions, so every small matmul waits on a wake-up. On 2 cores a decode step
of 32 rows ran about 1.6x slower in a second thread than in the thread that loaded the model,
and that thread's own work (the update) slowed as much for as long as the second one lived.

So the thread that loads the model and runs the update also samples: `run_with_caller` runs
the coroutine's event loop in a helper thread, and `await on_caller(fn, ...)` inside it hands
`fn` back to the calling thread, which runs these calls one at a time until the coroutine
ends. Outside `run_with_caller`, `on_caller` is `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]

    def run(self) -> None:
        if self.future.cancelled():  # its awaiter is gone (the rollouts failed or ended)
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except Exception as exc:  # the awaiting coroutine raises it
            self._settle(exc, None)
        except BaseException:  # Ctrl-C: the caller unwinds the whole run
            self.cancel()
            raise
        else:
            self._settle(None, result)

    def cancel(self) -> None:
        self._settle(asyncio.CancelledError(), None)

    def _settle(self, exc: BaseException | None, result: Any) -> None:
        def settle() -> None:
            if self.future.done():  # its awaiter was cancelled meanwhile
                return
            if isinstance(exc, asyncio.CancelledError):
                self.future.cancel()
            elif exc is not None:
                self.future.set_exception(exc)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(settle)


@dataclass
class _Inbox:
    calls: queue.SimpleQueue[_Call | None] = field(default_factory=queue.SimpleQueue)


_inbox: ContextVar[_Inbox | None] = ContextVar("agentrft_caller_inbox", default=None)


async def on_caller(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on the thread that called `run_with_caller`, awaited from its
    event loop; in a worker thread (`asyncio.to_thread`) anywhere else."""
    inbox = _inbox.get()
    if inbox is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    inbox.calls.put(_Call(fn, args, kwargs, loop, future))
    return await future


def run_with_caller(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, with the event loop in a helper thread while this thread runs what
    `on_caller` hands it. Exceptions from `coro` are raised here; an interrupt here (Ctrl-C)
    cancels `coro`, waits for it to unwind, then propagates."""
    inbox = _Inbox()
    outcome: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> T:
        outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await coro

    def loop_thread() -> None:
        _inbox.set(inbox)  # asyncio.run's tasks copy this thread's context
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            started.set()
            inbox.calls.put(None)

    thread = threading.Thread(target=loop_thread, name="agentrft-rollouts", daemon=True)
    thread.start()
    try:
        while (call := inbox.calls.get()) is not None:
            call.run()
    except BaseException:
        started.wait()
        if "task" in outcome:
            with contextlib.suppress(RuntimeError):  # the loop may have ended already
                outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        while (call := inbox.calls.get()) is not None:  # unwind: refuse what is still asked
            call.cancel()
        thread.join()
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]  # set by loop_thread
