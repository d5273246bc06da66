"""The ``memgate.v1.Memgate`` handlers: decode -> authorise -> await the engine -> encode.

Handlers hold no error handling and no batching: they raise ``engine.errors`` classes (the
interceptor maps them, one table, one place) and await :class:`engine.core.Engine`, which owns
the queue, the batcher, admission, fail-stop and timings. Store work (Get, History, ListReview,
Forget, Undo, ResolveReview) goes through the engine's store pool, where the gate's namespace
locks serialise writers of one namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any, TypeAlias

from engine.core import Engine, Streamed, Timings
from engine.errors import DeadlineExceeded, InvalidInput, NotFound
from engine.server import convert
from engine.server.interceptor import Call, current_call
from engine.server.metrics import Metrics
from engine.server.proto import pb, pb_grpc
from engine.types import Decision, Fact, ValidFacts
from engine.validation import check_namespace

__all__ = ["MemgateService", "timings_to_pb"]

_MAX_ID = 128

Context: TypeAlias = Any
"""``grpc.aio.ServicerContext``: grpcio ships no type stubs (the messages are typed by the
generated ``.pyi``)."""


def timings_to_pb(t: Timings) -> pb.Timings:
    """Every phase of the engine's typed timings on the wire."""
    return pb.Timings(
        tokenize=t.tokenize,
        queue=t.queue,
        embed=t.embed,
        search=t.search,
        nli=t.nli,
        store=t.store,
        total=t.total,
        batch_facts=t.batch_facts,
        decide=t.decide,
        keys=t.keys,
        other=t.other,
    )


def _decision(d: Decision, index: int, applied: bool) -> pb.Decision:
    msg: pb.Decision = convert.decision_to_pb(d, index)
    if not applied:
        msg.memory_id = ""  # a dry run stores nothing: no id to hand out
    return msg


def _check_namespace(namespace: str) -> None:
    check_namespace(namespace)  # the one rule of every RPC (engine.validation)


def _check_ref(namespace: str, ident: str, what: str) -> None:
    _check_namespace(namespace)
    if not ident or len(ident) > _MAX_ID:
        raise InvalidInput(f"{what} must be 1-{_MAX_ID} characters")


def _deadline(context: Context) -> float | None:
    remaining = context.time_remaining()
    if remaining is None:
        return None
    if remaining <= 0:
        raise DeadlineExceeded("the deadline passed before the request was read")
    return asyncio.get_running_loop().time() + float(remaining)


class MemgateService(pb_grpc.MemgateServicer):
    def __init__(
        self,
        engine: Engine,
        *,
        limits: convert.Limits,
        max_request_facts: int,
        metrics: Metrics | None = None,
    ) -> None:
        self._engine = engine
        self._limits = limits
        self._max_facts = max_request_facts
        self._metrics = metrics

    # -- decoding -----------------------------------------------------------------------------
    def _fact(self, msg: pb.Fact, index: int, call: Call) -> Fact:
        """Decode, check (the fact rule, once: the namespace before the token's prefixes),
        authorise."""
        fact = convert.fact_from_pb(msg, index, self._limits)
        self._engine.check_fact(fact, index)
        call.principal.permits(fact.namespace)
        return fact

    def _counted(self, decisions: Sequence[Decision], *, dry_run: bool) -> None:
        if self._metrics is not None:
            self._metrics.count_decisions([d.action for d in decisions], dry_run=dry_run)

    # -- batch triage -------------------------------------------------------------------------
    async def _decide(
        self,
        request: pb.TriageRequest | pb.WriteRequest,
        context: Context,
        apply: bool,
    ) -> tuple[list[pb.Decision], pb.Timings]:
        call = current_call()
        n = call.facts = len(request.facts)
        if n == 0:
            raise InvalidInput("a request needs at least one fact")
        if n > self._max_facts:
            raise InvalidInput(f"{n} facts in one request; the limit is {self._max_facts}")
        policy = convert.policy_from_pb(request.policy)
        overrides = convert.overrides_from_pb(request.overrides)
        facts = ValidFacts(self._fact(msg, i, call) for i, msg in enumerate(request.facts))
        triaged = await self._engine.triage(
            facts, policy, apply=apply, overrides=overrides, deadline=_deadline(context)
        )
        self._counted(triaged.decisions, dry_run=not apply)
        decisions = [_decision(d, i, apply) for i, d in enumerate(triaged.decisions)]
        return decisions, timings_to_pb(triaged.timings)

    async def Triage(self, request: pb.TriageRequest, context: Context) -> pb.TriageResponse:  # noqa: N802
        decisions, timings = await self._decide(request, context, apply=False)
        return pb.TriageResponse(decisions=decisions, timings=timings)

    async def Write(self, request: pb.WriteRequest, context: Context) -> pb.WriteResponse:  # noqa: N802
        decisions, timings = await self._decide(request, context, apply=True)
        return pb.WriteResponse(decisions=decisions, timings=timings)

    # -- streaming backfill -------------------------------------------------------------------
    async def Backfill(  # noqa: N802
        self,
        request_iterator: AsyncIterable[pb.BackfillRequest],
        context: Context,
    ) -> AsyncIterator[pb.BackfillResponse]:
        """Facts in, decisions out, in order, each sent as soon as its fact committed. The
        stream's policy, overrides and dry_run come from its first message."""
        call = current_call()
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        policy = convert.policy_from_pb(first.policy)
        overrides = convert.overrides_from_pb(first.overrides)

        async def facts() -> AsyncIterator[Fact]:
            yield self._fact(first.fact, 0, call)
            call.facts = 1
            index = 1
            async for msg in requests:
                yield self._fact(msg.fact, index, call)
                index += 1
                call.facts = index

        item: Streamed
        async for item in self._engine.stream(
            facts(),
            policy,
            apply=not first.dry_run,
            overrides=overrides,
            deadline=_deadline(context),
            checked=True,  # by self._fact
        ):
            self._counted((item.decision,), dry_run=first.dry_run)
            yield pb.BackfillResponse(
                decision=_decision(item.decision, item.index, item.applied),
                timings=timings_to_pb(item.timings),
            )

    # -- recall -------------------------------------------------------------------------------
    async def Recall(self, request: pb.RecallRequest, context: Context) -> pb.RecallResponse:  # noqa: N802
        call = current_call()
        call.facts = 1
        call.authorize(request.namespace)
        query = convert.text_from_bytes(request.query, "query", self._limits)
        recalled = await self._engine.recall(
            request.namespace,
            query,
            request.k or 10,
            deadline=_deadline(context),
            as_of=convert.as_of_from_pb(request.as_of),
            include_inactive=request.include_inactive,
        )
        hits = [
            pb.RecallHit(memory=convert.memory_to_pb(m), similarity=s) for m, s in recalled.hits
        ]
        return pb.RecallResponse(
            hits=hits,
            timings=timings_to_pb(recalled.timings),
            hidden=convert.hidden_to_pb(recalled.hidden),
            as_of_seq=recalled.seq or 0,
        )

    # -- store work ---------------------------------------------------------------------------
    def _ref(self, request: pb.MemoryRef, *, reads: bool = False) -> tuple[str, str]:
        _check_ref(request.namespace, request.memory_id, "memory_id")
        if request.as_of and not reads:
            raise InvalidInput("as_of applies to reads (Get, History), not to changes")
        current_call().authorize(request.namespace)
        return request.namespace, request.memory_id

    async def Get(self, request: pb.MemoryRef, context: Context) -> pb.GetResponse:  # noqa: N802
        ref = self._ref(request, reads=True)
        memory, t = await self._engine.get(*ref, convert.as_of_from_pb(request.as_of))
        if memory is None:
            raise NotFound(f"no memory {request.memory_id} in this namespace")
        return pb.GetResponse(memory=convert.memory_to_pb(memory), timings=timings_to_pb(t))

    async def History(self, request: pb.MemoryRef, context: Context) -> pb.HistoryResponse:  # noqa: N802
        ref = self._ref(request, reads=True)
        chain, t = await self._engine.history(*ref, convert.as_of_from_pb(request.as_of))
        if not chain:
            raise NotFound(f"no memory {request.memory_id} in this namespace")
        return pb.HistoryResponse(
            chain=[convert.memory_to_pb(m) for m in chain], timings=timings_to_pb(t)
        )

    async def Forget(self, request: pb.MemoryRef, context: Context) -> pb.ForgetResponse:  # noqa: N802
        forgotten, t = await self._engine.forget(*self._ref(request))
        return pb.ForgetResponse(memory_id=forgotten, timings=timings_to_pb(t))

    async def Undo(self, request: pb.MemoryRef, context: Context) -> pb.UndoResponse:  # noqa: N802
        (restored, undone), t = await self._engine.undo(*self._ref(request))
        return pb.UndoResponse(
            restored=convert.memory_to_pb(restored),
            undone=convert.memory_to_pb(undone),
            timings=timings_to_pb(t),
        )

    async def ListReview(  # noqa: N802
        self,
        request: pb.ListReviewRequest,
        context: Context,
    ) -> pb.ListReviewResponse:
        _check_namespace(request.namespace)
        current_call().authorize(request.namespace)
        limit = request.limit or 100
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be in [1, 1000]")
        items, t = await self._engine.list_review(request.namespace, limit)
        return pb.ListReviewResponse(
            items=[convert.review_to_pb(r) for r in items], timings=timings_to_pb(t)
        )

    async def ResolveReview(  # noqa: N802
        self,
        request: pb.ResolveReviewRequest,
        context: Context,
    ) -> pb.ResolveReviewResponse:
        _check_ref(request.namespace, request.review_id, "review_id")
        current_call().authorize(request.namespace)
        resolution = convert.resolution_from_pb(request.resolution)
        res, t = await self._engine.resolve_review(request.namespace, request.review_id, resolution)
        return pb.ResolveReviewResponse(
            status=res.review.status, memory_id=res.memory_id or "", timings=timings_to_pb(t)
        )

    async def ListEvents(  # noqa: N802
        self,
        request: pb.ListEventsRequest,
        context: Context,
    ) -> pb.ListEventsResponse:
        """The audit log of one namespace, paged by ``seq`` (a store read, like ListReview)."""
        ns, after, limit = convert.events_request_from_pb(request)
        current_call().authorize(ns)
        events, t = await self._engine.events(ns, after, limit)
        response: pb.ListEventsResponse = convert.events_to_pb(events, after, timings_to_pb(t))
        return response
