"""The ``memgate.v1.Memgate`` handlers: decode, authorise, admit, queue or run, encode.

Handlers hold no error handling: they raise ``engine.errors`` classes and the interceptor maps
them (one table, one place). Model work (Triage, Write, Backfill, Recall) goes through the shared
:class:`~engine.server.batcher.Batcher`; store work (Get, History, ListReview, Forget, Undo,
ResolveReview) runs on a small thread pool, where the gate's namespace locks serialise writers of
one namespace and let different namespaces proceed in parallel.

Fail-stop: a ``StorageError`` met anywhere (in a model batch, or in store work here) stops the
engine through the batcher's latch (:meth:`Batcher.fail`): health turns NOT_SERVING and every
later write, model or store, is refused without touching the store. Reads (Get, History,
ListReview) are still tried: after a full disk the store still answers them; after an I/O
error the store refuses them itself (it is poisoned, see ``engine.store.sqlite``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import (
    DeadlineExceeded,
    InvalidInput,
    MemgateError,
    NotFound,
    Overloaded,
    StorageError,
)
from engine.gate.gate import validate_fact
from engine.gate.policy import policy_by_name
from engine.server import convert
from engine.server.admission import Permits
from engine.server.batcher import Batcher, Served, refusal
from engine.server.interceptor import current_call
from engine.server.metrics import Metrics
from engine.server.proto import pb, pb_grpc
from engine.server.queue import estimate_tokens
from engine.types import Decision, Fact
from engine.validation import check_namespace

__all__ = ["MemgateService", "ModelWork", "run_model_batch"]

T = TypeVar("T")

_MAX_ID = 128


@dataclass(frozen=True)
class ModelWork:
    """One request's model work: facts to triage, or one recall query."""

    facts: tuple[Fact, ...] = ()
    query: tuple[str, str, int] | None = None
    """(namespace, query, k) for a recall."""


@dataclass(frozen=True)
class TriageGroup:
    """Requests that may share one ``Gate.triage`` call."""

    policy: str
    overrides: tuple[tuple[str, Any], ...]
    apply: bool


RECALL = "recall"


def run_model_batch(gate: Any, group: Hashable, works: list[ModelWork]) -> list[Any]:
    """Run one batch on the worker thread: one ``Gate.triage`` call for every request of a
    triage group (split back per request), or the recalls of a recall batch one by one.

    A merged triage that fails on its input is retried request by request, so one bad request
    cannot fail its neighbours. The handlers validate every fact before queueing, so this is a
    safety net; it is safe because the gate validates before it writes anything.
    """
    if group == RECALL:
        out: list[Any] = []
        for work in works:
            assert work.query is not None
            t0 = time.perf_counter()
            try:
                hits = gate.recall(*work.query)
            except MemgateError as exc:  # recalls are independent: the error stays with its own
                if isinstance(exc, StorageError):
                    raise  # fail-stop, as for writes
                out.append(exc)
                continue
            out.append((hits, {"search": time.perf_counter() - t0}))
        return out
    assert isinstance(group, TriageGroup)
    overrides = dict(group.overrides) or None
    flat = [f for w in works for f in w.facts]
    try:
        result = gate.triage(flat, group.policy, apply=group.apply, overrides=overrides)
    except InvalidInput:
        if len(works) == 1:
            raise
        return [_one(gate, group, overrides, w) for w in works]
    out = []
    start = 0
    for work in works:
        end = start + len(work.facts)
        out.append((result.decisions[start:end], result.timings))
        start = end
    return out


def _one(gate: Any, group: TriageGroup, overrides: dict[str, Any] | None, work: ModelWork) -> Any:
    try:
        result = gate.triage(list(work.facts), group.policy, apply=group.apply, overrides=overrides)
    except InvalidInput as exc:
        return exc
    return (result.decisions, result.timings)


def _check_namespace(namespace: str) -> None:
    check_namespace(namespace)  # the one rule of every RPC (engine.validation)


def _check_ref(namespace: str, ident: str, what: str) -> None:
    _check_namespace(namespace)
    if not ident or len(ident) > _MAX_ID:
        raise InvalidInput(f"{what} must be 1-{_MAX_ID} characters")


class MemgateService(pb_grpc.MemgateServicer):
    def __init__(
        self,
        gate: Any,
        batcher: Batcher[ModelWork, Any],
        permits: Permits,
        io: Executor,
        *,
        limits: convert.Limits,
        max_request_facts: int,
        backfill_window: int,
        token_counter: Callable[[Sequence[str]], list[int]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._gate = gate
        self._batcher = batcher
        self._permits = permits
        self._io = io
        self._limits = limits
        self._max_facts = max_request_facts
        self._window = backfill_window
        self._count = token_counter or (lambda texts: [estimate_tokens(t) for t in texts])
        self._metrics = metrics

    # -- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _deadline(context: Any) -> float | None:
        remaining = context.time_remaining()
        if remaining is None:
            return None
        if remaining <= 0:
            raise DeadlineExceeded("the deadline passed before the request was read")
        return asyncio.get_running_loop().time() + float(remaining)

    async def _io_call(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Run store work on the I/O pool; a storage failure trips the fail-stop latch."""
        t0 = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)
        except StorageError as exc:
            self._batcher.fail(exc)
            raise
        return result, time.perf_counter() - t0

    async def _io_write(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Store work that writes: refused once the engine has stopped (fail-stop)."""
        dead = self._batcher.dead
        if dead is not None:
            raise refusal(dead)
        return await self._io_call(fn, *args)

    def _facts(self, messages: Sequence[Any], start: int = 0) -> list[Fact]:
        call = current_call()
        facts = []
        for i, msg in enumerate(messages, start):
            fact = convert.fact_from_pb(msg, i, self._limits)
            call.authorize(fact.namespace)
            try:
                validate_fact(fact, self._gate.settings)
            except InvalidInput as exc:
                raise InvalidInput(f"fact {i}: {exc}") from None
            facts.append(fact)
        return facts

    @staticmethod
    def _group(policy: int, overrides_msg: Any, apply: bool) -> TriageGroup:
        name = convert.policy_from_pb(policy)
        overrides = convert.overrides_from_pb(overrides_msg)
        policy_by_name(name).with_overrides(overrides)  # validate now, not in a shared batch
        return TriageGroup(name, tuple(sorted(overrides.items())), apply)

    async def _queue(
        self, work: ModelWork, texts: list[str], group: Hashable, deadline: float | None
    ) -> tuple[Served[Any], float]:
        """Count ``texts``' tokens and queue ``work`` on the batcher: (served, tokenize seconds)."""
        t0 = time.perf_counter()
        tokens = sum(self._count(texts))
        tokenize = time.perf_counter() - t0
        served = await self._batcher.submit(
            work, group=group, facts=len(texts), tokens=tokens, deadline=deadline
        )
        return served, tokenize

    async def _submit(
        self, facts: list[Fact], group: TriageGroup, deadline: float | None
    ) -> tuple[Served[Any], float]:
        served, tokenize = await self._queue(
            ModelWork(facts=tuple(facts)), [f.text for f in facts], group, deadline
        )
        if self._metrics is not None:
            self._metrics.count_decisions(
                [d.action for d in served.result[0]], dry_run=not group.apply
            )
        return served, tokenize

    @staticmethod
    def _timings(served: Served[Any], tokenize: float, started: float) -> Any:
        phases = dict(served.result[1])
        phases["tokenize"] = tokenize
        phases["queue"] = served.queued_s
        phases["total"] = time.perf_counter() - started
        return convert.timings_to_pb(phases, served.batch_facts)

    # -- batch triage -------------------------------------------------------------------------
    async def _decide(self, request: Any, context: Any, apply: bool) -> tuple[list[Any], Any]:
        started = time.perf_counter()
        call = current_call()
        n = call.facts = len(request.facts)
        if n == 0:
            raise InvalidInput("a request needs at least one fact")
        if n > self._max_facts:
            raise InvalidInput(f"{n} facts in one request; the limit is {self._max_facts}")
        group = self._group(request.policy, request.overrides, apply)
        facts = self._facts(request.facts)
        deadline = self._deadline(context)
        if not self._permits.try_acquire(n):
            raise Overloaded("the server is at capacity; retry with backoff")
        try:
            served, tokenize = await self._submit(facts, group, deadline)
        finally:
            self._permits.release(n)
        decisions = [convert.decision_to_pb(d, i) for i, d in enumerate(served.result[0])]
        if not apply:
            for d in decisions:
                d.memory_id = ""  # a dry run stores nothing: no id to hand out
        return decisions, self._timings(served, tokenize, started)

    async def Triage(self, request: Any, context: Any) -> Any:  # noqa: N802
        decisions, timings = await self._decide(request, context, apply=False)
        return pb.TriageResponse(decisions=decisions, timings=timings)

    async def Write(self, request: Any, context: Any) -> Any:  # noqa: N802
        decisions, timings = await self._decide(request, context, apply=True)
        return pb.WriteResponse(decisions=decisions, timings=timings)

    # -- streaming backfill ---------------------------------------------------------------------
    async def Backfill(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Facts in, decisions out, in order. At most ``backfill_window`` facts of the stream are
        in flight; while the window is full the reader stops, so HTTP/2 flow control pushes back
        on the client. Facts take admission permits too, but wait for them instead of failing:
        a bulk stream slows down under load rather than being cut off."""
        call = current_call()
        loop = asyncio.get_running_loop()
        window = asyncio.Semaphore(self._window)
        freed = asyncio.Event()
        unlisten = self._permits.on_release(freed.set)
        pending: asyncio.Queue[Any] = asyncio.Queue()
        tasks: set[asyncio.Task[Any]] = set()

        async def acquire_permit() -> None:
            while not self._permits.try_acquire(1):
                freed.clear()
                await freed.wait()

        async def one(fact: Fact, group: TriageGroup, deadline: float | None) -> Any:
            try:
                return await self._submit([fact], group, deadline)
            finally:
                self._permits.release(1)

        async def reader() -> None:
            group: TriageGroup | None = None
            index = 0
            try:
                async for msg in request_iterator:
                    if group is None:
                        group = self._group(msg.policy, msg.overrides, not msg.dry_run)
                    fact = self._facts([msg.fact], index)[0]
                    deadline = self._deadline(context)
                    await window.acquire()
                    await acquire_permit()
                    task = loop.create_task(one(fact, group, deadline))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    pending.put_nowait((index, time.perf_counter(), task, group.apply))
                    index += 1
                    call.facts = index
            except Exception as exc:  # handed to the writer, which raises it in order
                pending.put_nowait(exc)
            else:
                pending.put_nowait(None)

        read = loop.create_task(reader())
        try:
            while True:
                item = await pending.get()
                if item is None:
                    break
                if isinstance(item, Exception):
                    raise item
                index, started, task, apply = item
                try:
                    served, tokenize = await task
                finally:
                    window.release()
                decision: Decision = served.result[0][0]
                msg = convert.decision_to_pb(decision, index)
                if not apply:
                    msg.memory_id = ""
                yield pb.BackfillResponse(
                    decision=msg, timings=self._timings(served, tokenize, started)
                )
        finally:
            unlisten()
            read.cancel()
            for task in list(tasks):
                task.cancel()

    # -- recall -------------------------------------------------------------------------------
    async def Recall(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        call = current_call()
        call.facts = 1
        call.authorize(request.namespace)
        query = convert.text_from_bytes(request.query, "query", self._limits)
        try:  # a bad namespace or blank query takes no permit and no slot on the model thread
            validate_fact(Fact(namespace=request.namespace, text=query), self._gate.settings)
        except InvalidInput as exc:
            raise InvalidInput(f"query: {exc}") from None
        k = request.k or 10
        if not 1 <= k <= 1000:
            raise InvalidInput("k must be in [1, 1000]")
        deadline = self._deadline(context)
        if not self._permits.try_acquire(1):
            raise Overloaded("the server is at capacity; retry with backoff")
        try:
            served, tokenize = await self._queue(
                ModelWork(query=(request.namespace, query, k)), [query], RECALL, deadline
            )
        finally:
            self._permits.release(1)
        hits = [
            pb.RecallHit(memory=convert.memory_to_pb(m), similarity=s) for m, s in served.result[0]
        ]
        return pb.RecallResponse(hits=hits, timings=self._timings(served, tokenize, started))

    # -- store work ---------------------------------------------------------------------------
    def _ref(self, request: Any) -> tuple[str, str]:
        _check_ref(request.namespace, request.memory_id, "memory_id")
        current_call().authorize(request.namespace)
        return request.namespace, request.memory_id

    async def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        ns, mid = self._ref(request)
        memory, secs = await self._io_call(self._gate.get, ns, mid)
        if memory is None:
            raise NotFound(f"no memory {mid} in this namespace")
        return pb.GetResponse(
            memory=convert.memory_to_pb(memory), timings=_store_timings(secs, started)
        )

    async def History(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        ns, mid = self._ref(request)
        chain, secs = await self._io_call(self._gate.history, ns, mid)
        if not chain:
            raise NotFound(f"no memory {mid} in this namespace")
        return pb.HistoryResponse(
            chain=[convert.memory_to_pb(m) for m in chain], timings=_store_timings(secs, started)
        )

    async def Forget(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        ns, mid = self._ref(request)
        forgotten, secs = await self._io_write(self._gate.forget, ns, mid)
        return pb.ForgetResponse(memory_id=forgotten, timings=_store_timings(secs, started))

    async def Undo(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        ns, mid = self._ref(request)
        (restored, undone), secs = await self._io_write(self._gate.undo, ns, mid)
        return pb.UndoResponse(
            restored=convert.memory_to_pb(restored),
            undone=convert.memory_to_pb(undone),
            timings=_store_timings(secs, started),
        )

    async def ListReview(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        _check_namespace(request.namespace)
        current_call().authorize(request.namespace)
        limit = request.limit or 100
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be in [1, 1000]")
        items, secs = await self._io_call(self._gate.list_review, request.namespace, limit)
        return pb.ListReviewResponse(
            items=[convert.review_to_pb(r) for r in items], timings=_store_timings(secs, started)
        )

    async def ResolveReview(self, request: Any, context: Any) -> Any:  # noqa: N802
        started = time.perf_counter()
        _check_ref(request.namespace, request.review_id, "review_id")
        current_call().authorize(request.namespace)
        resolution = convert.resolution_from_pb(request.resolution)
        res, secs = await self._io_write(
            self._gate.resolve_review, request.namespace, request.review_id, resolution
        )
        return pb.ResolveReviewResponse(
            status=res.review.status,
            memory_id=res.memory_id or "",
            timings=_store_timings(secs, started),
        )

    async def ListEvents(self, request: Any, context: Any) -> Any:  # noqa: N802
        """The audit log of one namespace, paged by ``seq`` (a store read, like ListReview)."""
        started = time.perf_counter()
        ns, after, limit = convert.events_request_from_pb(request)
        current_call().authorize(ns)
        events, secs = await self._io_call(self._gate.store.events, ns, after, limit)
        return convert.events_to_pb(events, after, _store_timings(secs, started))


def _store_timings(store_s: float, started: float) -> Any:
    return convert.timings_to_pb({"store": store_s, "total": time.perf_counter() - started})
