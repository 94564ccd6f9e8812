"""The serving scheduler: continuous batching for `agentrft serve-model`.

One thread owns the model. Each turn of its loop it admits waiting requests (one prefill
forward pass for all of them, within `max_prefill_tokens`), so a request that arrives
mid-decode joins the running batch at the next step instead of waiting for the batch to
finish; then it decodes one token for every running row and hands each request its new
tokens at once, which is what streaming sends. A row that ends (a stop token, a stop string,
its max_tokens) or whose client went away leaves the batch in the same turn, freeing its
slot. At most `max_running` rows decode together; the rest wait in arrival order.

    request -> submit -> waiting -> admit (prefill, first token) -> step, step, ... -> done
                                         \\__ every step: tokens to the request's queue __/

The thread stops when nothing is left to do and starts again with the next request, so a
service that drops its model does not keep it alive through an idle thread. `close()` (the
server shutting down) fails every waiting and running request and lets the thread end.

When it goes idle, the thread gives freed heap pages back to the OS
(`memory.release_free_memory`, about 20 ms): glibc keeps what PyTorch freed. After 3 minutes
of 32 mixed clients (bench/serve_load.py, measured while `_retire` still let batches grow)
serve-model's RSS ended 1.2 GB above its start without it, and 0.1 GB above with it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agentrft.memory import release_free_memory
from agentrft.policy import Completion, SamplingParams
from agentrft.policy.hf import HFPolicy
from agentrft.serve.running_batch import Row, RunningBatch

log = logging.getLogger(__name__)
MAX_PREFILL_TOKENS = 8192  # padded prompt tokens per admitting forward pass (at least one request)

# what a request receives after each step: (choice index, a new token id or, last, the
# choice's Completion) pairs, or the exception that failed it
Events = list[tuple[int, int | Completion]] | BaseException


@dataclass(eq=False)
class Job:
    """One request: its rows (one per choice) and where their tokens go."""

    rows: list[Row]
    emit: Callable[[Events], None]  # called from the scheduler thread
    cancelled: bool = False

    @property
    def padded_prompt_tokens(self) -> int:
        return len(self.rows) * max(len(r.prompt) for r in self.rows)


@dataclass
class SchedulerStats:
    steps: int = 0  # decode steps
    admissions: int = 0  # prefill passes
    joined_running: int = 0  # admissions into a batch that was already decoding
    rows: int = 0
    sampled_tokens: int = 0
    row_steps: int = 0  # rows decoded, summed over steps (/ steps: the mean batch)
    peak_running: int = 0


class DecodeScheduler:
    def __init__(
        self,
        policy: HFPolicy,
        max_running: int = 32,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
    ) -> None:
        self.policy = policy
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.stats = SchedulerStats()
        self._waiting: deque[Job] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running: list[Job] = []  # the decoding thread's jobs, for close()
        self._closed = False

    def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        seeds: Sequence[int | None],
        emit: Callable[[Events], None],
    ) -> Job:
        """Queue one request with a row per seed (None: a random stream). `emit` gets its
        events from the scheduler thread."""
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        dev = self.policy.device
        rows = []
        for seed in seeds:
            gen = torch.Generator(device=dev)
            if seed is None:
                gen.seed()
            else:
                gen.manual_seed(int(seed) % 2**63)
            rows.append(Row(params, params.max_tokens, prompt=list(prompt), generator=gen))
        job = Job(rows, emit)
        with self._lock:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            self._waiting.append(job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentrft-decode", daemon=True
                )
                self._thread.start()
        return job

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, seeds: Sequence[int | None]
    ) -> RequestEvents:
        """Queue a request now and return its events (see RequestEvents). Call it from the
        event loop that will read them."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Events] = asyncio.Queue()

        def emit(events: Events) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, events)

        return RequestEvents(self.submit(prompt, params, seeds, emit), queue, len(seeds))

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new requests, fail every waiting and running one (SchedulerClosed), and
        wait up to `timeout` seconds for the decoding thread to end."""
        with self._lock:
            self._closed = True
            thread = self._thread
            waiting, self._waiting = list(self._waiting), deque()
            running = list(self._running)
        for job in waiting + running:
            job.cancelled = True
            _send(job, SchedulerClosed("the server shut down before this request finished"))
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        batch = RunningBatch(self.policy)
        jobs: list[Job] = []  # the jobs with rows in `batch`
        while True:
            with self._lock:
                if not self._waiting and not jobs:
                    self._thread = None
                    del batch
                    release_free_memory()
                    return
                admit = self._take(len(batch))
            jobs += admit
            self._running = jobs
            try:
                if admit:
                    self.stats.admissions += 1
                    self.stats.joined_running += bool(len(batch))
                    self.stats.rows += sum(len(j.rows) for j in admit)
                    batch.admit([r for j in admit for r in j.rows])
                    self._deliver(admit)
                    jobs = self._retire(batch, jobs)
                if len(batch):
                    batch.step()
                    self.stats.steps += 1
                    self.stats.row_steps += len(batch)
                    self._deliver(jobs)
                    jobs = self._retire(batch, jobs)
            except Exception as exc:  # a failed forward pass fails the requests in it, loudly
                log.exception("decoding failed")
                for job in jobs:
                    _send(job, exc)
                batch, jobs = RunningBatch(self.policy), []
            self.stats.peak_running = max(self.stats.peak_running, len(batch))

    @staticmethod
    def _retire(batch: RunningBatch, jobs: list[Job]) -> list[Job]:
        """Drop finished rows and cancelled requests from `batch`; the jobs still running.

        `cancelled` is set from the event loop's thread at any moment, so it is read once:
        read twice, a request cancelled in between kept its rows in the batch but left the
        jobs, and its rows then decoded on, never retired, until the scheduler went idle
        (under steady load, never; each step the batch grew a column)."""
        now = [(j, j.cancelled) for j in jobs]
        batch.retire([r for j, cancelled in now for r in j.rows if r.finish_reason or cancelled])
        return [
            j for j, cancelled in now if not cancelled and any(not r.finish_reason for r in j.rows)
        ]

    def _take(self, running: int) -> list[Job]:
        """Waiting jobs to admit now, oldest first, while there are free rows (a job always
        fits an empty batch) and their prompts fit one prefill pass (the first always does:
        a long prompt costs the running rows one long step, it does not wait for them to
        end). Called with the lock held."""
        taken: list[Job] = []
        budget = self.max_prefill_tokens
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                continue
            rows_fit = running + len(job.rows) <= self.max_running or not (taken or running)
            if not rows_fit or (taken and job.padded_prompt_tokens > budget):
                break
            taken.append(self._waiting.popleft())
            running += len(job.rows)
            budget -= job.padded_prompt_tokens
        return taken

    def _deliver(self, jobs: Sequence[Job]) -> None:
        """Send each job its rows' new tokens, and the Completion of rows that just ended."""
        for job in jobs:
            if job.cancelled:
                continue
            events: list[tuple[int, int | Completion]] = []
            for i, row in enumerate(job.rows):
                if row.sent == len(row.tokens):
                    continue  # ended at an earlier step
                events += [(i, t) for t in row.tokens[row.sent :]]
                self.stats.sampled_tokens += len(row.tokens) - row.sent
                row.sent = len(row.tokens)
                if row.finish_reason:
                    events.append((i, row.completion()))
            if events:
                _send(job, events)


class SchedulerClosed(RuntimeError):
    """The scheduler was closed (the server is shutting down)."""


class RequestEvents:
    """A queued request's events in order: (choice, token id) as each token is sampled, then
    (choice, Completion) once that choice is done. `aclose()` before the end (the client
    went away, the server gave up on it) cancels the request, freeing its rows at the next
    step; so does dropping the object unread."""

    def __init__(self, job: Job, queue: asyncio.Queue[Events], choices: int) -> None:
        self.job, self._queue, self._left = job, queue, choices
        self._pending: list[tuple[int, int | Completion]] = []

    def __aiter__(self) -> RequestEvents:
        return self

    async def __anext__(self) -> tuple[int, int | Completion]:
        try:
            while not self._pending:
                if not self._left:
                    raise StopAsyncIteration
                events = await self._queue.get()
                if isinstance(events, BaseException):
                    raise events
                self._pending = list(events)
        except BaseException:
            self.job.cancelled = True  # failed, cancelled (CancelledError) or done: no more work
            raise
        index, event = self._pending.pop(0)
        self._left -= isinstance(event, Completion)
        return index, event

    async def aclose(self) -> None:
        if self._left:
            self.job.cancelled = True

    def __del__(self) -> None:
        self.job.cancelled = True


def _send(job: Job, events: Events) -> None:
    """Hand `events` to the job's caller; a caller that is gone (its event loop closed)
    cancels the job."""
    try:
        job.emit(events)
    except RuntimeError:  # the event loop has closed
        job.cancelled = True
