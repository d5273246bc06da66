"""The dynamic batcher: a thin asyncio driver over :class:`~engine.core.queue.TokenBudgetQueue`.

Every request that needs the model (``Triage``, ``Write``, ``Backfill``, ``Recall``) is
submitted here; all of them share one queue and one worker thread, so concurrent requests are
answered by one model call. The driver

* wakes on events only: a push sets an :class:`asyncio.Event`; while the queue holds a partial
  batch the driver waits for that event *or* the oldest entry's ``max_wait_s``, whichever comes
  first. There is no sleep-polling;
* runs up to ``lanes`` batches at once on the executor (``run_in_executor``), never two that
  hold one lock (a namespace, a stream: :class:`~engine.core.queue.Entry` ``locks``), so a batch
  waiting on one namespace's store lock holds up no other namespace; while a lane is busy, new
  requests of its namespaces pile up and form the next, larger batch;
* drops entries whose caller gave up (the future was cancelled) or whose deadline passed before
  they reach the model, failing the latter with ``DeadlineExceeded``;
* dies on a fatal error (``is_fatal``: a ``StorageError``, or anything that is not an
  ``Exception``): the failed batch and every queued request fail, later submits are refused
  and ``on_dead`` is called, which turns the health service NOT_SERVING. This is the server's
  fail-stop latch: store work served outside the batcher (Forget, Undo, ResolveReview) trips
  it too, with :meth:`Batcher.fail`. The refusal says why (:func:`refusal`): ``StorageFull``
  after a full disk (RESOURCE_EXHAUSTED), ``Unavailable`` otherwise (UNAVAILABLE).

Shutdown keeps its word with a *cutoff* (:meth:`Batcher.cut_off_at`): a batch is started only
if twice its estimated model time (facts x the measured seconds per fact) ends before the
cutoff; the first batch that does not fit, and every later one, fails with ``Unavailable``
before it reaches the model, so nothing commits after the grace period and a stream's commits
stay a prefix of it.

``run(group, payloads)`` is injected; it returns one result (or one exception) per payload, in
order, or raises to fail the whole batch. ``measure(results)`` (optional) says how many of the
batch's seconds count as work for the rate estimate (the engine counts model forwards only, not
lock or store waits); without it the batch's wall time counts. ``pairs(results)`` (optional)
says how many NLI pair tokens the batch ran; the queue learns the batch group's pair ratio from
it (``TokenBudgetQueue.observe``, its work-token budget). ``on_batch(batch, seconds)``
hears of every batch that ran, with those seconds (metrics, and the admission rate estimate).
The unit tests drive the batcher with a fake ``run`` and no model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.core.queue import Batch, Entry, QueueSettings, TokenBudgetQueue
from engine.errors import DeadlineExceeded, MemgateError, StorageError, StorageFull, Unavailable

__all__ = ["Batcher", "Served", "default_is_fatal", "refusal"]

P = TypeVar("P")
R = TypeVar("R")

log = logging.getLogger("memgate.core.batcher")


def default_is_fatal(exc: BaseException) -> bool:
    """A failed store write stops the engine (fail-stop); so does anything not an Exception."""
    return isinstance(exc, StorageError) or not isinstance(exc, Exception)


def _shutting_down() -> Unavailable:
    return Unavailable("the server is shutting down: this work was not started")


def refusal(cause: BaseException) -> MemgateError:
    """What a request gets from a server stopped by ``cause``: a full disk stays a full disk
    (RESOURCE_EXHAUSTED) for every refused request, anything else is ``Unavailable``."""
    if isinstance(cause, StorageFull):
        return StorageFull("the disk holding the store is full; this server stopped writing")
    return Unavailable("the engine stopped after a fatal error; this server is not serving")


@dataclass(frozen=True)
class Served(Generic[R]):
    """One request's result and what its batch looked like."""

    result: R
    queued_s: float
    """From submit to the start of the batch that served it."""
    batch_facts: int
    batch_entries: int
    run_s: float = 0.0
    """Wall time of the batch's ``run`` on the worker."""


@dataclass(eq=False)
class _Job(Generic[P, R]):
    payload: P
    future: asyncio.Future[Served[R]]


class Batcher(Generic[P, R]):
    """Owns the queue and the worker. Create and use it on one event loop."""

    def __init__(
        self,
        run: Callable[[Hashable, list[P]], Sequence[R | BaseException]],
        settings: QueueSettings | None = None,
        *,
        executor: Executor,
        is_fatal: Callable[[BaseException], bool] = default_is_fatal,
        on_dead: Callable[[BaseException], None] | None = None,
        on_batch: Callable[[Batch[_Job[P, R]], float], None] | None = None,
        lanes: int = 1,
        measure: Callable[[Sequence[R | BaseException]], float | None] | None = None,
        pairs: Callable[[Sequence[R | BaseException]], int | None] | None = None,
    ) -> None:
        if not 1 <= lanes <= 1024:
            raise ValueError(f"lanes must be in [1, 1024], got {lanes}")
        self._run = run
        self._lanes = lanes
        self._measure_run = measure
        self._pairs = pairs
        self._running: set[asyncio.Task[None]] = set()
        self._queue: TokenBudgetQueue[_Job[P, R]] = TokenBudgetQueue(settings)
        self._executor = executor
        self._is_fatal = is_fatal
        self._on_dead = on_dead
        self._on_batch = on_batch
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._dead: BaseException | None = None
        self._cutoff: float | None = None
        self._cut = False
        self._per_fact: float | None = None
        self.batches = 0
        """Batches sent to the worker since start."""

    # -- state ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._dead is None and self._task is not None and not self._task.done()

    @property
    def dead(self) -> BaseException | None:
        """The error that killed the worker, or None."""
        return self._dead

    @property
    def pending_facts(self) -> int:
        return self._queue.pending_facts

    @property
    def seconds_per_fact(self) -> float | None:
        """Measured model seconds per fact (a moving average over batches); None before one."""
        return self._per_fact

    def estimate(self, facts: int) -> float:
        """Estimated model seconds of a batch of ``facts`` (0 before any measurement)."""
        return 0.0 if self._per_fact is None else facts * self._per_fact

    def cut_off_at(self, when: float) -> None:
        """Start no batch that would not finish by ``when`` (``loop.time()``): from the first
        one that would not, every queued and later entry fails with ``Unavailable``."""
        self._cutoff = when if self._cutoff is None else min(self._cutoff, when)
        if self._wake is not None:
            self._wake.set()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver task on the running loop."""
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._drive(), name="memgate-batcher")
        self._task.add_done_callback(self._driver_done)

    async def close(self) -> None:
        """Serve what is queued, then stop the driver. New submits are refused."""
        self._closing = True
        if self._task is None:
            return
        assert self._wake is not None
        self._wake.set()
        await asyncio.shield(self._task)

    # -- producer ---------------------------------------------------------------------------
    async def submit(
        self,
        payload: P,
        *,
        group: Hashable,
        facts: int,
        tokens: int,
        deadline: float | None = None,
        source: Hashable | None = None,
        locks: frozenset[Hashable] = frozenset(),
    ) -> Served[R]:
        """Queue ``payload`` and wait for its result. ``deadline`` is on ``loop.time()``;
        ``source`` names the stream the payload belongs to (see ``max_source_facts``);
        ``locks`` what its batch holds while it runs (see the module docstring)."""
        if self._dead is not None:
            raise refusal(self._dead)
        if self._cut:
            raise _shutting_down()
        if self._closing or self._task is None or self._wake is None:
            raise Unavailable("the server is not accepting model work (starting or draining)")
        loop = asyncio.get_running_loop()
        now = loop.time()
        if deadline is not None and now >= deadline:
            raise DeadlineExceeded("the deadline passed before the request was queued")
        future: asyncio.Future[Served[R]] = loop.create_future()
        entry = Entry(_Job(payload, future), group, facts, tokens, now, deadline, source, locks)
        future.add_done_callback(lambda f: entry.cancel() if f.cancelled() else None)
        self._queue.push(entry)
        self._wake.set()
        return await future

    # -- driver -----------------------------------------------------------------------------
    async def _drive(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while self._dead is None:
            now = loop.time()
            batch: Batch[_Job[P, R]] | None = None
            dropped: list[Entry[_Job[P, R]]] = []
            if len(self._running) < self._lanes:
                batch, dropped = self._queue.take(now, flush=self._closing)
            for entry in dropped:
                if not entry.payload.future.done():
                    entry.payload.future.set_exception(
                        DeadlineExceeded("the deadline passed while the request was queued")
                    )
            if batch is not None and self._past_cutoff(batch, loop.time()):
                self._refuse(batch)
                continue
            if batch is not None:
                self._start(batch, loop)
                continue
            if self._closing and not len(self._queue):
                if self._running:
                    await asyncio.gather(*self._running, return_exceptions=True)
                    continue
                return
            wake = None if len(self._running) >= self._lanes else self._queue.wake_at()
            if self._cutoff is not None and not self._cut:
                if loop.time() >= self._cutoff:
                    # Past the cutoff no batch can start: refuse what waits (on a lock, or
                    # for a lane) now, rather than wake at a time already gone, again and
                    # again: that spin held the GIL from the lanes committing the last batches.
                    self._cut = True
                    log.info("shutdown cutoff: no more batches start")
                    self._refuse_queued()
                    continue
                wake = self._cutoff if wake is None else min(wake, self._cutoff)
            self._wake.clear()
            if wake is None:
                await self._wake.wait()
            else:
                try:
                    async with asyncio.timeout_at(wake):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    def _past_cutoff(self, batch: Batch[_Job[P, R]], now: float) -> bool:
        if self._cut:
            return True
        # Twice the estimate: a batch runs longer than the average one often enough.
        if self._cutoff is None or now + 2 * self.estimate(batch.facts) <= self._cutoff:
            return False
        self._cut = True
        log.info("shutdown cutoff: no more batches start")
        return True

    def _refuse(self, batch: Batch[_Job[P, R]]) -> None:
        for entry in batch.entries:
            if not entry.payload.future.done():
                entry.payload.future.set_exception(_shutting_down())
        self._refuse_queued()

    def _refuse_queued(self) -> None:
        for entry in self._queue.drain():
            if not entry.payload.future.done():
                entry.payload.future.set_exception(_shutting_down())

    def _start(self, batch: Batch[_Job[P, R]], loop: asyncio.AbstractEventLoop) -> None:
        """Run ``batch`` on a lane; when it ends, its locks are free and the driver wakes."""
        task = loop.create_task(self._dispatch(batch, loop), name="memgate-batch")
        self._running.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._running.discard(t)
            self._queue.finished(batch)
            if not t.cancelled() and t.exception() is not None:
                self._die(t.exception() or RuntimeError("batch failed"))
            if self._wake is not None:
                self._wake.set()

        task.add_done_callback(done)

    @property
    def running(self) -> int:
        """Batches on the lanes now."""
        return len(self._running)

    async def _dispatch(self, batch: Batch[_Job[P, R]], loop: asyncio.AbstractEventLoop) -> None:
        jobs = [e.payload for e in batch.entries]
        self.batches += 1
        t0 = loop.time()
        try:
            results = await loop.run_in_executor(
                self._executor, self._run, batch.group, [j.payload for j in jobs]
            )
            seconds = loop.time() - t0
            work = self._measure_run(results) if self._measure_run is not None else None
            work = seconds if work is None else work
            self._measure(batch.facts, work)
            pair_tokens = self._pairs(results) if self._pairs is not None else None
            if pair_tokens is not None:
                self._queue.observe(batch.group, batch.tokens, pair_tokens)
            if self._on_batch is not None:
                self._on_batch(batch, work)
            if len(results) != len(jobs):
                raise RuntimeError(f"run returned {len(results)} results for {len(jobs)} payloads")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the worker's failure is its callers' answer
            if self._is_fatal(exc):
                self._die(exc, jobs)
            else:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
            return
        for entry, job, result in zip(batch.entries, jobs, results, strict=True):
            if job.future.done():
                continue  # cancelled while in the model: its answer is dropped
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(
                    Served(result, batch.started - entry.enqueued, batch.facts, len(jobs), seconds)
                )

    def prime(self, seconds_per_fact: float) -> None:
        """Seed the rate estimate (the engine's warm-up batch) before any batch ran."""
        if seconds_per_fact > 0 and self._per_fact is None:
            self._per_fact = seconds_per_fact

    def _measure(self, facts: int, seconds: float) -> None:
        if facts <= 0 or seconds <= 0:
            return
        per = seconds / facts
        self._per_fact = per if self._per_fact is None else 0.8 * self._per_fact + 0.2 * per

    def fail(self, exc: BaseException) -> None:
        """Stop as if the worker had died of ``exc`` (a store failure met outside the batcher).
        Call it on the batcher's loop. Idempotent: the first cause is kept."""
        self._die(exc)
        if self._wake is not None:
            self._wake.set()  # the driver sees it is dead and ends

    def _die(self, exc: BaseException, jobs: Sequence[_Job[P, R]] = ()) -> None:
        if self._dead is not None:
            for job in jobs:  # a batch that was running when another cause stopped us
                if not job.future.done():
                    job.future.set_exception(refusal(self._dead))
            return
        self._dead = exc
        log.error("engine stopped (fail-stop): %s", type(exc).__name__, exc_info=exc)
        stranded = list(jobs) + [e.payload for e in self._queue.drain()]
        for job in stranded:
            if not job.future.done():
                job.future.set_exception(refusal(exc))
        if self._on_dead is not None:
            self._on_dead(exc)

    def _driver_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            if self._closing:  # torn down while closing: fail what is left, quietly
                for entry in self._queue.drain():
                    if not entry.payload.future.done():
                        entry.payload.future.set_exception(Unavailable("the server stopped"))
                return
            self._die(Unavailable("the batcher was cancelled"))
        elif task.exception() is not None:
            self._die(task.exception() or RuntimeError("batcher failed"))
