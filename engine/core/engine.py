"""The engine facade: one object every caller awaits, the gRPC service and in-process callers alike.

::

    caller (gRPC handler, SyncEngine: backfill, eval, adapters)
        -> Engine.triage / recall / stream        admission permits, real token counts
        -> Batcher (TokenBudgetQueue, ``lanes`` threads; one batch per namespace set at a time)
        -> run_model_batch -> Gate.triage / Gate.recall          on a lane thread
             -> embedder / NLI forwards -> ModelStage             on the one model thread

Stages (docs/engine-stages.md): a *lane* runs one batch of one namespace set from its parse to
its commit (store reads, the namespace lock, the fsync'd COMMIT); batches of different
namespaces run on different lanes at once, batches of one namespace one after the other in
arrival order (the queue's locks), so a later fact of a namespace sees what an earlier one
committed. Only the models' forwards go to the one model thread (:mod:`engine.core.stage`),
so a namespace waiting on a lock held elsewhere waits alone.

Transport-free: no ``grpc`` here. Errors are ``engine.errors`` classes; results are typed
(:mod:`engine.core.results`). The gate is a collaborator behind :class:`GateLike`; how a fact
is validated, a policy resolved and a text tokenised is injected (``validate``,
``check_policy``, ``tokenizer``) so this package depends on nothing that does I/O, and the
factory at the edge (``engine.app.build_engine``) wires the gate's own rule, policy and
embedder in.

Checked once (issue 32): a request's facts are checked and its policy resolved here, at the
edge, before it takes a permit; its texts are tokenised here for the token budget. The batch
then goes to ``Gate.triage`` as :class:`~engine.types.ValidFacts` carrying those encodings,
with the resolved policy, and the gate checks, resolves and tokenises none of it again.

Admission (TEI's ``--max-concurrent-requests``): requests take one permit per fact and are
refused with ``Overloaded`` when ``max_queued_facts`` are queued or in the model, or when their
own deadline cannot be met by the queue ahead of them (``admit_by_deadline``); otherwise they
queue. Streams wait for permits instead.

Streams (:meth:`Engine.stream`) release decisions fact by fact, in order, as each fact's batch
commits; at most ``max_source_facts`` facts of one stream share a model call. On shutdown
(:meth:`Engine.stop_streams`) streams stop reading, deliver what is in flight until the cutoff
and end with ``Unavailable`` naming the index of the last committed fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Mapping,
    Sequence,
)
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from engine.core.admission import Permits
from engine.core.batcher import Batcher, Served, refusal
from engine.core.queue import Batch, QueueSettings, estimate_tokens
from engine.core.results import Recalled, Streamed, Timings, Triaged, split
from engine.core.stage import ModelStage, StageSettings
from engine.errors import InvalidInput, MemgateError, Overloaded, StorageError, Unavailable
from engine.lifecycle import AsOf, Hidden
from engine.types import Decision, Event, Fact, Memory, ValidFacts

__all__ = [
    "RECALL",
    "CoreSettings",
    "Engine",
    "GateLike",
    "ModelWork",
    "ModelDone",
    "TriageGroup",
    "run_model_batch",
    "shutdown_message",
]

T = TypeVar("T")


class Counted(Protocol):
    """One text tokenised for the budget (``engine.runtime.base.Encoded``): its token count;
    the rest is the model's, carried to the model call untouched."""

    @property
    def tokens(self) -> int: ...


class TriageOutcome(Protocol):
    @property
    def decisions(self) -> Sequence[Decision]: ...

    @property
    def timings(self) -> Mapping[str, float]: ...


class GateLike(Protocol):
    """What the engine needs of the gate (``engine.gate.gate.Gate`` satisfies it)."""

    def triage(
        self,
        facts: Sequence[Fact],
        policy: Any = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> TriageOutcome:
        """``facts`` come as :class:`~engine.types.ValidFacts` and ``policy`` as the policy
        ``check_policy`` resolved when the edge wired both; else plain facts and a name."""
        ...

    def recall(self, namespace: str, query: str, k: int = 10) -> list[tuple[Memory, float]]:
        """Active hits, best first. The gate's own recall also takes ``as_of`` and
        ``include_inactive`` keywords (sent only when set) and returns a list that carries
        ``.hidden`` (:class:`~engine.lifecycle.Hidden`) and ``.seq``."""
        ...

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        """The memory now; the gate's own get also takes ``as_of`` (sent only when set)."""
        ...

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """The chain now; the gate's own history also takes ``as_of`` (sent only when set)."""
        ...

    def forget(self, namespace: str, memory_id: str) -> str: ...

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]: ...

    def list_review(self, namespace: str, limit: int = 100) -> list[Any]: ...

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> Any: ...

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]: ...


@dataclass(frozen=True)
class CoreSettings:
    """How the engine batches and admits work. Every field is range-checked."""

    batching: QueueSettings = field(default_factory=QueueSettings)
    """How model calls are cut (token budget, facts, wait, facts of one stream per call)."""
    max_queued_facts: int = 1024
    """Admission permits: facts queued or in the model at once (TEI's max concurrent
    requests). Beyond it a request is refused with ``Overloaded``; inside it, it queues and its
    deadline decides. Sized for memory and for a queue that drains in a few large batches."""
    max_queue_delay_s: float | None = None
    """Optionally also bound the facts in flight by what the worker finishes in this many
    seconds at its measured rate (never below ``min_admitted_facts``). Off by default: clients
    carry deadlines, and a tight budget sheds closed loops that would have been served
    (docs/experiments/2026-12-05-default-door.md)."""
    min_admitted_facts: int = 16
    """Floor of the delay-derived bound."""
    admit_by_deadline: bool = True
    """Refuse (``Overloaded``) at the door a request whose deadline the queue cannot meet:
    the facts queued or in the model, plus its own, at the measured seconds per fact (times
    ``deadline_headroom``) would take longer than its remaining time. It would only wait and
    fail with DEADLINE_EXCEEDED; refused at once it can retry elsewhere. Requests without a
    deadline, and streams, are bounded by ``max_queued_facts`` alone."""
    deadline_headroom: float = 1.25
    """How much longer than the estimate a request's wait may turn out (batches vary)."""
    stream_window: int = 256
    """Most facts of one stream in flight (queued or in the model); the reader waits beyond."""
    io_threads: int = 4
    """Threads for store work (Get, History, Forget, Undo, reviews)."""
    expiry_interval_s: float | None = 60.0
    """How often the expiry sweep runs (``Gate.expire``): each run writes ``expire`` events in
    batches of the gate's ``expiry_batch`` until nothing is due. None: no sweep (expired
    memories are still hidden lazily at read and decision time, but stay in the index)."""
    expiry_pause_s: float = 0.01
    """Pause between two sweep batches. The store's lock is not fair: a sweep that took it
    again at once could keep a waiting writer out for several batches; with the pause a
    writer waits for one batch at most (benchmarks/bench_expiry.py)."""
    lanes: int = 8
    """Batches that may run at once, each on its own thread and each over namespaces no other
    running batch touches: their parse, store reads, lock waits and commits overlap, and a
    namespace waiting on another replica's lock holds up only itself. Model forwards stay on
    one thread. Keep it below half the PostgreSQL pool (a lane holds one connection from its
    decision to its commit and reads through others)."""
    stall_s: float = 30.0
    """The model thread is *stalled* when work has waited on it this long without a forward
    finishing (:attr:`Engine.stalled`); the server then reports NOT_SERVING."""
    stage: StageSettings = field(default_factory=StageSettings)
    """The model stage's budgets per model: pair tokens for the NLI model, text tokens for the
    embedder, per merged model call and per trip of one lane's call (``engine.core.stage``)."""

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.max_queued_facts <= 10_000_000, "max_queued_facts must be in [1, 1e7]"),
            (
                self.max_queue_delay_s is None or 0.0 < self.max_queue_delay_s <= 3600.0,
                "max_queue_delay_s must be in (0, 3600] seconds, or None",
            ),
            (1 <= self.min_admitted_facts <= 10_000_000, "min_admitted_facts must be in [1, 1e7]"),
            (1 <= self.stream_window <= 100_000, "stream_window must be in [1, 100000]"),
            (
                self.expiry_interval_s is None or 0.01 <= self.expiry_interval_s <= 86400.0,
                "expiry_interval_s must be in [0.01, 86400] seconds, or None",
            ),
            (0.0 <= self.expiry_pause_s <= 10.0, "expiry_pause_s must be in [0, 10] seconds"),
            (1.0 <= self.deadline_headroom <= 100.0, "deadline_headroom must be in [1, 100]"),
            (1 <= self.io_threads <= 256, "io_threads must be in [1, 256]"),
            (1 <= self.lanes <= 256, "lanes must be in [1, 256]"),
            (0.1 <= self.stall_s <= 3600.0, "stall_s must be in [0.1, 3600] seconds"),
            (isinstance(self.stage, StageSettings), "stage must be a StageSettings"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(message)


# -- the model batch: what runs on the worker thread ---------------------------------------------
@dataclass(frozen=True)
class ModelWork:
    """One request's model work: facts to triage, or one recall query."""

    facts: tuple[Fact, ...] = ()
    query: tuple[str, str, int] | None = None
    """(namespace, query, k) for a recall."""
    encoded: tuple[Any, ...] | None = None
    """The facts' texts as the budget tokenised them (one per fact), for the model call."""
    as_of: AsOf | None = None
    """A recall as of this point of the log (None: now)."""
    include_inactive: bool = False
    """A recall that returns inactive memories too, each with its status."""


@dataclass(frozen=True)
class TriageGroup:
    """Requests that may share one ``Gate.triage`` call."""

    policy: str
    overrides: tuple[tuple[str, Any], ...]
    apply: bool
    resolved: Hashable | None = field(default=None, compare=False)
    """The policy the edge resolved from ``policy`` and ``overrides`` (the gate's hashable
    ``Policy``), handed to the gate as it is; None when the engine has no such check."""


RECALL = "recall"
"""The group of recall requests."""


@dataclass(frozen=True)
class _Keyed:
    """A batch group of one namespace set: requests of one set share a model call. A stream's
    facts form one group of their own (``stream``), whatever their namespaces: they run in
    order anyway, and keyed by namespace a stream over many namespaces was cut one fact per
    batch whatever ``max_source_facts`` allowed."""

    group: Hashable
    namespaces: frozenset[str]
    stream: Hashable | None = None


@dataclass(frozen=True)
class ModelDone:
    """One request's share of a model call: its decisions or hits, and the call's phases."""

    timings: Timings
    decisions: tuple[Decision, ...] = ()
    hits: tuple[tuple[Memory, float], ...] = ()
    hidden: Hidden = field(default_factory=Hidden)
    seq: int | None = None
    forward_s: float | None = None
    """The batch's work for the admission estimate: its forwards' seconds on the model thread
    plus its lane's CPU seconds, never its waits; None for a gate whose models do not run on
    the stage (its wall time counts instead)."""
    pair_tokens: int | None = None
    """The batch's NLI pair tokens as the model stage counted them (the lanes' batch budget
    learns its group's pair ratio from it); None for a gate whose models do not run on the
    stage."""


def run_model_batch(
    gate: GateLike, group: Hashable, works: list[ModelWork]
) -> list[ModelDone | BaseException]:
    """Run one batch on the worker thread: one ``Gate.triage`` call for every request of a
    triage group (split back per request), or the recalls of a recall batch one by one.

    A merged triage that fails on its input is retried request by request, so one bad request
    cannot fail its neighbours (the engine validates every fact before queueing, so this is a
    safety net; it is safe because the gate validates before it writes anything).
    """
    if group == RECALL:
        out: list[ModelDone | BaseException] = []
        for work in works:
            assert work.query is not None
            t0 = time.perf_counter()
            options: dict[str, Any] = {}
            if work.as_of is not None:
                options["as_of"] = work.as_of
            if work.include_inactive:
                options["include_inactive"] = True
            try:
                hits = gate.recall(*work.query, **options)
            except MemgateError as exc:  # recalls are independent: the error stays with its own
                if isinstance(exc, StorageError):
                    raise  # fail-stop, as for writes
                out.append(exc)
                continue
            out.append(
                ModelDone(
                    Timings(search=time.perf_counter() - t0),
                    hits=tuple(hits),
                    hidden=getattr(hits, "hidden", None) or Hidden(),
                    seq=getattr(hits, "seq", None),
                )
            )
        return out
    assert isinstance(group, TriageGroup)
    overrides = dict(group.overrides) or None
    flat = _request(group, works)
    t0 = time.perf_counter()
    try:
        if group.resolved is None:
            result = gate.triage(flat, group.policy, apply=group.apply, overrides=overrides)
        else:
            result = gate.triage(flat, group.resolved, apply=group.apply)
    except InvalidInput:
        if len(works) == 1:
            raise
        return [_one(gate, group, overrides, w) for w in works]
    timings = Timings.of_run(result.timings, time.perf_counter() - t0)
    parts = split(list(result.decisions), [len(w.facts) for w in works])
    return [ModelDone(timings, decisions=p) for p in parts]


def _request(group: TriageGroup, works: Sequence[ModelWork]) -> Sequence[Fact]:
    """The batch's facts for the gate: checked at the edge (``ValidFacts``, with their
    encodings when every request carries them) when the edge resolved the policy too."""
    facts = [f for w in works for f in w.facts]
    if group.resolved is None:
        return facts
    if all(w.encoded is not None for w in works):
        return ValidFacts.of(facts, [e for w in works for e in w.encoded or ()])
    return ValidFacts(facts)


def _one(
    gate: GateLike, group: TriageGroup, overrides: dict[str, Any] | None, work: ModelWork
) -> ModelDone | BaseException:
    t0 = time.perf_counter()
    facts = _request(group, [work])
    try:
        if group.resolved is None:
            result = gate.triage(facts, group.policy, apply=group.apply, overrides=overrides)
        else:
            result = gate.triage(facts, group.resolved, apply=group.apply)
    except InvalidInput as exc:
        return exc
    timings = Timings.of_run(result.timings, time.perf_counter() - t0)
    return ModelDone(timings, decisions=tuple(result.decisions))


# -- the facade ----------------------------------------------------------------------------------
_END = object()
_STOPPED = object()


_UNSET: Any = object()
_POLICIES_KEPT = 256
"""Distinct (policy, overrides) resolutions an engine keeps (then it starts afresh)."""


def _no_check_fact(fact: Fact) -> None:
    return None


def _no_check_policy(policy: str, overrides: Mapping[str, Any]) -> Hashable | None:
    return None


class Engine:
    """Batching, admission and timings over one gate. Start and use it on one event loop.

    ``validate(fact)`` and ``check_policy(name, overrides)`` raise ``InvalidInput`` for what the
    gate would refuse, so a bad request fails alone, before it takes a permit;
    ``check_policy`` returns the resolved policy (hashable), which the gate then takes as it
    is, with the facts as :class:`~engine.types.ValidFacts` (None: the gate checks and
    resolves itself, as for a gate without these checks). ``tokenizer(texts)`` tokenises
    texts for the batch budget (the embedder's ``encode_items``; default: a len/4 estimate,
    for gates without one); a fact's encoding travels with it into the embedder call.
    ``stage`` is the model thread the gate's forwards run on; ``warm()`` runs one batch through
    every model (on the stage) and returns the model seconds per fact it measured
    (:meth:`warm_up`).
    """

    def __init__(
        self,
        gate: GateLike,
        settings: CoreSettings | None = None,
        *,
        validate: Callable[[Fact], None] = _no_check_fact,
        check_policy: Callable[[str, Mapping[str, Any]], Hashable | None] = _no_check_policy,
        tokenizer: Callable[[Sequence[str]], Sequence[Counted]] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
        on_batch: Callable[[int, int, float], None] | None = None,
        stage: ModelStage | None = None,
        warm: Callable[[], float] | None = None,
    ) -> None:
        self.gate = gate
        self.settings = settings or CoreSettings()
        s = self.settings
        self._validate = validate
        self._check_policy = check_policy
        self._tokenizer = tokenizer
        self._policies: dict[tuple[str, tuple[tuple[str, Any], ...]], Hashable | None] = {}
        """Each (policy, overrides) resolved once (``check_policy`` is deterministic for a
        gate): about 0.1 ms a resolution, which the event loop no longer pays per request."""
        self._on_dead = on_dead
        self._on_batch = on_batch
        self.permits = Permits(
            s.max_queued_facts, max_delay_s=s.max_queue_delay_s, min_limit=s.min_admitted_facts
        )
        self.stage = stage or ModelStage(s.stage)
        """The model thread; the edge routes the gate's forwards to it (``engine.app``)."""
        self._lanes = ThreadPoolExecutor(s.lanes, thread_name_prefix="memgate-lane")
        self._io: Executor = ThreadPoolExecutor(s.io_threads, thread_name_prefix="memgate-store")
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="memgate-tokenize")
        self._warm = warm
        self.batcher: Batcher[ModelWork, ModelDone] = Batcher(
            self._run_batch,
            s.batching,
            executor=self._lanes,
            on_dead=self._died,
            on_batch=self._batch_done,
            lanes=s.lanes,
            measure=_forward_seconds,
            pairs=_pair_tokens,
        )
        self._stop_streams: asyncio.Event | None = None
        self._streams_until: float | None = None
        self._streams_tail = 0.0
        self._closed = False
        self._sweeper: asyncio.Task[None] | None = None

    # -- state --------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.batcher.alive

    @property
    def dead(self) -> BaseException | None:
        """The error that stopped the engine (fail-stop), or None."""
        return self.batcher.dead

    @property
    def pending_facts(self) -> int:
        return self.batcher.pending_facts

    @property
    def seconds_per_fact(self) -> float | None:
        """Measured seconds of work per fact (moving average of forward time plus the lanes'
        CPU: lock and store waits are not work); None before the warm-up or the first batch."""
        return self.batcher.seconds_per_fact

    @property
    def stalled(self) -> bool:
        """Work has waited on the model thread for ``stall_s`` without a forward finishing."""
        return self.stage.stalled_s() >= self.settings.stall_s

    def _run_batch(
        self, group: Hashable, works: list[ModelWork]
    ) -> list[ModelDone | BaseException]:
        """One batch on a lane: the gate's steps here, its forwards on the model thread."""
        assert isinstance(group, _Keyed)
        cpu0 = time.thread_time()
        with self.stage.charged() as charge:
            out = run_model_batch(self.gate, group.group, works)
        # Work = the forwards' time on the model thread + the lane's own CPU (parse, search,
        # SQL encoding). Waits (a namespace lock, store round-trips, fsync, the model thread's
        # queue) use no CPU here and are not work: they do not slow other namespaces.
        staged = bool(self.stage.forwards)
        work = charge.seconds + (time.thread_time() - cpu0) if staged else None
        pairs = charge.pair_tokens if staged else None
        return [
            replace(r, forward_s=work, pair_tokens=pairs) if isinstance(r, ModelDone) else r
            for r in out
        ]

    async def warm_up(self) -> float | None:
        """Run one batch through every model before serving (a cold first call costs many
        times a warm one) and seed the admission estimate with its model seconds per fact, so
        a fresh replica admits by what its models cost. Returns that estimate."""
        if self._warm is None:
            return None
        warm = self._warm
        stage = self.stage

        def run() -> float:
            with stage.charged():
                return warm()

        per_fact = await asyncio.get_running_loop().run_in_executor(self._lanes, run)
        self.batcher.prime(per_fact)
        self.permits.observe(1, per_fact)
        return per_fact

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the batcher on the running loop."""
        self._stop_streams = asyncio.Event()
        self.batcher.start()
        if self.settings.expiry_interval_s is not None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(self.settings.expiry_interval_s), name="memgate-expiry"
            )

    async def _sweep(self, interval_s: float) -> None:
        """The periodic expiry sweep: every ``interval_s``, expire what is due in bounded
        batches (one store transaction each, so a writer waits for one batch at most), until
        a batch comes back short. A storage failure stops the engine (fail-stop, as for
        writes); a retryable error waits for the next round."""
        while not self._closed:
            await asyncio.sleep(interval_s)
            try:
                while not self._closed and self.batcher.dead is None:
                    expired, _ = await self.expire()
                    if expired == 0:
                        break
                    # Let waiting writers in between batches (the store's lock is not fair).
                    await asyncio.sleep(self.settings.expiry_pause_s)
            except StorageError:
                return
            except MemgateError:
                continue

    def stop_streams(self, until: float, tail: float = 0.0) -> None:
        """Shutdown, step one: streams read no new fact, start no model call that would end
        after ``until`` (``loop.time()``), deliver what commits before it, and end with
        ``Unavailable`` naming their last committed fact. Unary requests already queued are
        served under the same cutoff.

        A batch that started in time can still be committing at ``until`` (a loaded machine
        runs slower than the estimate): a stream waits up to ``tail`` seconds more for it and
        delivers it, so that what it names as committed is what was committed. Only a commit
        landing after ``until + tail`` goes undelivered (the client's replay of it, under its
        idempotency key, is answered from the record)."""
        self._streams_until = (
            until if self._streams_until is None else min(self._streams_until, until)
        )
        self._streams_tail = max(self._streams_tail, tail)
        self.batcher.cut_off_at(until)
        if self._stop_streams is not None:
            self._stop_streams.set()

    async def run_io(self, fn: Callable[[], T]) -> T:
        """Run blocking work on the engine's store pool (index recovery, snapshots)."""
        return await asyncio.get_running_loop().run_in_executor(self._io, fn)

    async def close(self) -> None:
        """Serve what is queued (under any cutoff), stop the batcher and the threads."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.batcher.close()
        loop = asyncio.get_running_loop()
        for pool in (self._lanes, self._io, self._tokenize):
            await loop.run_in_executor(None, lambda p=pool: p.shutdown(wait=True))  # type: ignore[misc]
        await loop.run_in_executor(None, self.stage.close)

    def fail(self, exc: BaseException) -> None:
        """Stop the engine as if the worker had died of ``exc`` (fail-stop)."""
        self.batcher.fail(exc)

    def _died(self, exc: BaseException) -> None:
        if self._on_dead is not None:
            self._on_dead(exc)

    def _batch_done(self, batch: Batch[Any], seconds: float) -> None:
        self.permits.observe(batch.facts, seconds)
        if self._on_batch is not None:
            self._on_batch(batch.facts, len(batch.entries), seconds)

    # -- checks -------------------------------------------------------------------------------
    def group(
        self, policy: str, overrides: Mapping[str, Any] | None, *, apply: bool
    ) -> TriageGroup:
        """The batch group of a request; the policy and overrides are checked now, not inside
        a shared batch."""
        ov = dict(overrides or {})
        key = (policy, tuple(sorted(ov.items())))
        try:
            resolved = self._policies.get(key, _UNSET)
        except TypeError:  # an unhashable override value: the check refuses it
            resolved = _UNSET
        if resolved is _UNSET:
            resolved = self._check_policy(policy, ov)
            if self._validate is _no_check_fact:
                resolved = None  # facts this engine did not check are not handed on as checked
            if len(self._policies) >= _POLICIES_KEPT:
                self._policies.clear()
            self._policies[key] = resolved
        return TriageGroup(policy, key[1], apply, resolved)

    def check_fact(self, fact: Fact, index: int | None = None) -> None:
        """Raise ``InvalidInput`` (naming the fact's position) for a fact the gate refuses."""
        try:
            self._validate(fact)
        except InvalidInput as exc:
            if index is None:
                raise
            raise InvalidInput(f"fact {index}: {exc}") from None

    # -- model work ---------------------------------------------------------------------------
    async def _tokens(self, texts: list[str]) -> tuple[int, tuple[Counted, ...] | None, float]:
        """The texts' tokens for the budget, and their encodings (None: estimated)."""
        if self._tokenizer is None:
            return sum(estimate_tokens(t) for t in texts), None, 0.0
        t0 = time.perf_counter()
        encoded = await asyncio.get_running_loop().run_in_executor(
            self._tokenize, self._tokenizer, texts
        )
        return sum(e.tokens for e in encoded), tuple(encoded), time.perf_counter() - t0

    async def _queue(
        self,
        work: ModelWork,
        texts: list[str],
        group: Hashable,
        deadline: float | None,
        source: Hashable | None = None,
    ) -> tuple[Served[ModelDone], float]:
        tokens, encoded, tokenize = await self._tokens(texts)
        if work.facts and encoded is not None:
            work = replace(work, encoded=encoded)  # tokenised once: into the model call too
        if work.query is not None or (isinstance(group, TriageGroup) and not group.apply):
            # A recall or a dry run only reads: it takes no namespace lock, so it waits on no
            # writer, and dry runs of every namespace share one batch as before.
            keyed, locks = _Keyed(group, frozenset()), frozenset[Hashable]()
        else:
            names = frozenset(f.namespace for f in work.facts)
            keyed = _Keyed(group, names) if source is None else _Keyed(group, frozenset(), source)
            locks = frozenset[Hashable](names)
        if source is not None:
            locks = locks | {source}  # a stream's facts commit one batch after the other
        # One running batch per group: while it runs, its group's next requests pile up into
        # the next, larger batch (lanes exist for other namespaces, not for more of the same).
        locks = locks | {keyed}
        served = await self.batcher.submit(
            work,
            group=keyed,
            facts=len(texts),
            tokens=tokens,
            deadline=deadline,
            source=source,
            locks=locks,
        )
        return served, tokenize

    def _admit(self, n: int, deadline: float | None) -> None:
        if self.batcher.dead is not None:
            raise refusal(self.batcher.dead)
        per_fact = self.batcher.seconds_per_fact
        if deadline is not None and per_fact is not None and self.settings.admit_by_deadline:
            wait = (self.permits.in_use + n) * per_fact * self.settings.deadline_headroom
            left = deadline - asyncio.get_running_loop().time()
            if wait > left:
                raise Overloaded(
                    f"the queue holds about {wait:.1f} s of work, more than this request's "
                    f"deadline leaves ({max(0.0, left):.1f} s); retry with backoff"
                )
        if not self.permits.try_acquire(n):
            raise Overloaded("the server is at capacity; retry with backoff")

    @staticmethod
    def _timings(served: Served[ModelDone], tokenize: float, started: float) -> Timings:
        return served.result.timings.around(
            tokenize=tokenize,
            queue=served.queued_s,
            total=time.perf_counter() - started,
            batch_facts=served.batch_facts,
            batch_entries=served.batch_entries,
        )

    async def triage(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        *,
        apply: bool = False,
        overrides: Mapping[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Triaged:
        """Decide ``facts`` in order (``apply``: and commit them in one transaction).

        ``deadline`` is absolute, on ``loop.time()``. Raises ``Overloaded`` when admission is
        full, ``DeadlineExceeded`` when the deadline passes in the queue."""
        started = time.perf_counter()
        if not facts:
            raise InvalidInput("a request needs at least one fact")
        group = self.group(policy, overrides, apply=apply)
        if not isinstance(facts, ValidFacts):  # the server checks each as it decodes it
            for i, fact in enumerate(facts):
                self.check_fact(fact, i)
        n = len(facts)
        self._admit(n, deadline)
        try:
            served, tokenize = await self._queue(
                ModelWork(facts=tuple(facts)), [f.text for f in facts], group, deadline
            )
        finally:
            self.permits.release(n)
        return Triaged(served.result.decisions, self._timings(served, tokenize, started), apply)

    async def recall(
        self,
        namespace: str,
        query: str,
        k: int = 10,
        *,
        deadline: float | None = None,
        as_of: AsOf | None = None,
        include_inactive: bool = False,
    ) -> Recalled:
        """The ``k`` memories of ``namespace`` active now (or at ``as_of``) most similar to
        ``query``, with the counts of the inactive ones it hid (``include_inactive``: those
        too, each with its status)."""
        started = time.perf_counter()
        try:  # a bad namespace or blank query takes no permit and no slot on the model thread
            self._validate(Fact(namespace=namespace, text=query))
        except InvalidInput as exc:
            raise InvalidInput(f"query: {exc}") from None
        if not 1 <= k <= 1000:
            raise InvalidInput("k must be in [1, 1000]")
        self._admit(1, deadline)
        try:
            served, tokenize = await self._queue(
                ModelWork(
                    query=(namespace, query, k), as_of=as_of, include_inactive=include_inactive
                ),
                [query],
                RECALL,
                deadline,
            )
        finally:
            self.permits.release(1)
        done = served.result
        return Recalled(
            done.hits, self._timings(served, tokenize, started), hidden=done.hidden, seq=done.seq
        )

    async def stream(
        self,
        facts: AsyncIterable[Fact],
        policy: str = "strict",
        *,
        apply: bool = True,
        overrides: Mapping[str, Any] | None = None,
        deadline: float | None = None,
        checked: bool = False,
    ) -> AsyncIterator[Streamed]:
        """Facts in, decisions out, in order, each as soon as its fact's batch committed.

        At most ``stream_window`` facts are in flight: beyond it the reader stops pulling
        ``facts`` (over gRPC, HTTP/2 flow control then pushes back on the client). Facts wait
        for admission permits instead of being refused: a bulk stream slows down under load.
        An error raised by ``facts`` (a bad message) or by a fact ends the stream in order,
        after every decision before it. On shutdown the stream ends with ``Unavailable``.
        ``checked``: the caller ran :meth:`check_fact` on each fact (the server does, as it
        decodes them), so they are not checked again."""
        group = self.group(policy, overrides, apply=apply)
        async for item in _Stream(self, facts, group, deadline, checked).run():
            yield item

    async def _stream_one(
        self, fact: Fact, group: TriageGroup, deadline: float | None, source: Hashable
    ) -> tuple[Served[ModelDone], float]:
        try:
            return await self._queue(
                ModelWork(facts=(fact,)), [fact.text], group, deadline, source=source
            )
        finally:
            self.permits.release(1)

    # -- store work ---------------------------------------------------------------------------
    async def _io_call(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Run store work on the I/O pool; a storage failure trips the fail-stop latch."""
        t0 = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)
        except StorageError as exc:
            self.batcher.fail(exc)
            raise
        return result, time.perf_counter() - t0

    async def _io_write(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Store work that writes: refused once the engine has stopped (fail-stop)."""
        dead = self.batcher.dead
        if dead is not None:
            raise refusal(dead)
        return await self._io_call(fn, *args)

    async def get(
        self, namespace: str, memory_id: str, as_of: AsOf | None = None
    ) -> tuple[Memory | None, Timings]:
        """The memory now, or as it was at ``as_of`` (None: absent then)."""
        args = (namespace, memory_id) if as_of is None else (namespace, memory_id, as_of)
        memory, secs = await self._io_call(self.gate.get, *args)
        return memory, Timings(store=secs, total=secs)

    async def history(
        self, namespace: str, memory_id: str, as_of: AsOf | None = None
    ) -> tuple[list[Memory], Timings]:
        """The supersedes chain now, or its memories that existed at ``as_of``."""
        args = (namespace, memory_id) if as_of is None else (namespace, memory_id, as_of)
        chain, secs = await self._io_call(self.gate.history, *args)
        return chain, Timings(store=secs, total=secs)

    async def expire(self, limit: int | None = None) -> tuple[int, Timings]:
        """One step of the expiry sweep (``Gate.expire``): how many memories it expired."""
        dead = self.batcher.dead
        if dead is not None:
            raise refusal(dead)
        expire = getattr(self.gate, "expire", None)
        if expire is None:  # a gate without expiry (test doubles)
            return 0, Timings()
        done, secs = await self._io_call(expire, limit)
        return len(done), Timings(store=secs, total=secs)

    async def forget(self, namespace: str, memory_id: str) -> tuple[str, Timings]:
        forgotten, secs = await self._io_write(self.gate.forget, namespace, memory_id)
        return forgotten, Timings(store=secs, total=secs)

    async def undo(self, namespace: str, memory_id: str) -> tuple[tuple[Memory, Memory], Timings]:
        pair, secs = await self._io_write(self.gate.undo, namespace, memory_id)
        return pair, Timings(store=secs, total=secs)

    async def list_review(self, namespace: str, limit: int) -> tuple[list[Any], Timings]:
        items, secs = await self._io_call(self.gate.list_review, namespace, limit)
        return items, Timings(store=secs, total=secs)

    async def events(
        self, namespace: str, after_seq: int, limit: int
    ) -> tuple[list[Event], Timings]:
        """The namespace's audit log after ``after_seq`` (the store's event log)."""
        found, secs = await self._io_call(self.gate.events, namespace, after_seq, limit)
        return found, Timings(store=secs, total=secs)

    async def resolve_review(
        self, namespace: str, review_id: str, resolution: str
    ) -> tuple[Any, Timings]:
        res, secs = await self._io_write(self.gate.resolve_review, namespace, review_id, resolution)
        return res, Timings(store=secs, total=secs)


def _first_done(results: Sequence[ModelDone | BaseException]) -> ModelDone | None:
    """A batch's first answer (every request of a batch carries the same batch figures)."""
    return next((r for r in results if isinstance(r, ModelDone)), None)


def _forward_seconds(results: Sequence[ModelDone | BaseException]) -> float | None:
    """A batch's model-thread seconds."""
    done = _first_done(results)
    return None if done is None else done.forward_s


def _pair_tokens(results: Sequence[ModelDone | BaseException]) -> int | None:
    """A batch's NLI pair tokens."""
    done = _first_done(results)
    return None if done is None else done.pair_tokens


def shutdown_message(last: int) -> str:
    """What a stream cut by shutdown is told: where to resume."""
    if last < 0:
        return "the server is shutting down; no fact of this stream was committed: resume from 0"
    return (
        f"the server is shutting down; the last committed fact is index {last} "
        f"(facts 0-{last} are committed): resume from index {last + 1}"
    )


@dataclass(eq=False)
class _Pending:
    index: int
    started: float
    task: asyncio.Task[tuple[Served[ModelDone], float]]


class _Stream:
    """One stream's reader task and in-order writer (see :meth:`Engine.stream`)."""

    def __init__(
        self,
        engine: Engine,
        facts: AsyncIterable[Fact],
        group: TriageGroup,
        deadline: float | None,
        checked: bool = False,
    ) -> None:
        self.engine = engine
        self.checked = checked
        self.facts = facts
        self.group = group
        self.deadline = deadline
        self.window = asyncio.Semaphore(engine.settings.stream_window)
        self.pending: asyncio.Queue[_Pending | BaseException | object] = asyncio.Queue()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stop = engine._stop_streams or asyncio.Event()

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the writer raises it in order, or it was not needed

    async def _unless_stopped(self, aw: Awaitable[T]) -> T | object:
        """``aw``'s result, or ``_STOPPED`` when shutdown began first (``aw`` is cancelled)."""
        if self.stop.is_set():
            if asyncio.iscoroutine(aw):
                aw.close()
            return _STOPPED
        task = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return _STOPPED

    async def _permit(self) -> None:
        permits = self.engine.permits
        freed = asyncio.Event()
        unlisten = permits.on_release(freed.set)
        try:
            while not permits.try_acquire(1):
                freed.clear()
                await freed.wait()
        finally:
            unlisten()

    async def _read(self) -> None:
        engine = self.engine
        source = object()
        index = 0
        it = aiter(self.facts)
        try:
            while True:
                fact = await self._unless_stopped(anext(it, _END))
                if fact is _END or fact is _STOPPED:
                    self.pending.put_nowait(fact)
                    return
                assert isinstance(fact, Fact)
                if not self.checked:
                    engine.check_fact(fact, index)
                if await self._unless_stopped(self.window.acquire()) is _STOPPED:
                    self.pending.put_nowait(_STOPPED)
                    return
                if await self._unless_stopped(self._permit()) is _STOPPED:
                    self.window.release()
                    self.pending.put_nowait(_STOPPED)
                    return
                task = asyncio.get_running_loop().create_task(
                    engine._stream_one(fact, self.group, self.deadline, source)
                )
                self.tasks.add(task)
                task.add_done_callback(self._done)
                self.pending.put_nowait(_Pending(index, time.perf_counter(), task))
                index += 1
        except Exception as exc:  # handed to the writer, which raises it in order
            self.pending.put_nowait(exc)

    async def _result(self, item: _Pending) -> tuple[Served[ModelDone], float] | None:
        """The fact's result; None when shutdown's cutoff came first (not delivered)."""
        if not self.stop.is_set():
            got = await self._unless_stopped(asyncio.shield(item.task))
            if got is not _STOPPED:
                assert isinstance(got, tuple)
                return got
        until = self.engine._streams_until
        loop = asyncio.get_running_loop()
        left = None if until is None else max(0.0, until + self.engine._streams_tail - loop.time())
        try:
            async with asyncio.timeout(left):
                return await asyncio.shield(item.task)
        except TimeoutError:
            return None
        except Unavailable:
            return None  # the cutoff refused it before the model

    async def run(self) -> AsyncIterator[Streamed]:
        reader = asyncio.get_running_loop().create_task(self._read())
        last = -1
        try:
            while True:
                item = await self.pending.get()
                if item is _END:
                    return
                if item is _STOPPED:
                    raise Unavailable(shutdown_message(last))
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, _Pending)
                try:
                    got = await self._result(item)
                finally:
                    self.window.release()
                if got is None:
                    raise Unavailable(shutdown_message(last))
                served, tokenize = got
                last = item.index
                yield Streamed(
                    item.index,
                    served.result.decisions[0],
                    Engine._timings(served, tokenize, item.started),
                    self.group.apply,
                )
        finally:
            reader.cancel()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(reader, *self.tasks, return_exceptions=True)
