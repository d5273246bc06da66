"""The write gate: batch triage of incoming facts against a namespace's stored memories.

One batch, any mix of namespaces: one embedder call, one grouped index search per namespace, one
NLI call over every candidate pair; facts are decided in order, so a later fact sees what earlier
ones did. ``apply=True`` commits every decision in one store transaction, then moves the indexes.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any, Generic, TypeVar, cast

import numpy as np

from engine import reads
from engine.errors import InvalidInput, NotFound
from engine.gate.commit import commit
from engine.gate.decide import ActiveByKey, decide
from engine.gate.embed import embed
from engine.gate.evidence import measure, scored, settle
from engine.gate.judge import VerdictJudge
from engine.gate.judge.features import JUDGED
from engine.gate.names import Rule
from engine.gate.plan import plan
from engine.gate.policy import Policy, policy_by_name
from engine.gate.ports import NLI, Embedder, Index, Store
from engine.gate.probe import Probe
from engine.gate.recall import recall
from engine.gate.relate import relate
from engine.gate.score import score
from engine.gate.thresholds import for_embedder, for_model
from engine.lifecycle import AsOf, expiry_time
from engine.store import Expired, WriteResult, new_memory_id
from engine.store.base import Resolution, ReviewResolution
from engine.types import KINDS, Decision, Event, Fact, Memory, ReviewItem, ValidFacts
from engine.validation import is_namespace

__all__ = ["Gate", "GateSettings", "TriageResult", "decide_recalled", "policy_for"]

S = TypeVar("S", bound=Store)
X = TypeVar("X", bound=Index)


@dataclass(frozen=True)
class GateSettings:
    """Limits of the gate. Every field is range-checked."""

    max_batch: int = 2048
    """Most facts in one triage call."""
    max_text_chars: int = 8192
    """Longest accepted fact text (characters). Longer texts are refused, never silently cut."""
    max_metadata_bytes: int = 16384
    max_inactive_scan: int = 2000
    """Most inactive memories (newest first) a recall scores exactly to count what it hid
    (beyond it ``hidden.partial``)."""
    expiry_batch: int = 500
    """Most memories one expiry sweep step marks expired, in one store transaction."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 1_000_000:
            raise InvalidInput("max_batch must be in [1, 1000000]")
        if not 1 <= self.max_text_chars <= 1_000_000:
            raise InvalidInput("max_text_chars must be in [1, 1000000]")
        if not 0 <= self.max_inactive_scan <= 1_000_000:
            raise InvalidInput("max_inactive_scan must be in [0, 1000000]")
        if not 1 <= self.expiry_batch <= 100_000:
            raise InvalidInput("expiry_batch must be in [1, 100000]")


@dataclass
class TriageResult:
    decisions: list[Decision]
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: embed, search, identify, relate, nli, decide, store."""
    nli_pairs: int = 0


def validate_fact(fact: Fact, settings: GateSettings) -> None:
    if not is_namespace(fact.namespace):  # the one rule of every entry point
        raise InvalidInput(
            "namespace must be 1-128 characters of letters, digits and _ . : / @ -, "
            "starting with a letter or digit"
        )
    if not isinstance(fact.text, str) or not fact.text.strip():
        raise InvalidInput("fact text is empty")
    if len(fact.text) > settings.max_text_chars:
        raise InvalidInput(
            f"fact text has {len(fact.text)} characters; the limit is {settings.max_text_chars}"
        )
    if "\x00" in fact.text:
        raise InvalidInput("fact text contains a NUL character")
    if fact.kind not in KINDS:
        raise InvalidInput(f"unknown kind {fact.kind!r}: choose one of {', '.join(KINDS)}")
    if fact.key is not None and (not fact.key.strip() or len(fact.key) > 256):
        raise InvalidInput("key must be 1-256 characters")
    if fact.idempotency_key is not None and not 1 <= len(fact.idempotency_key) <= 128:
        raise InvalidInput("idempotency_key must be 1-128 characters")
    if fact.expires_at is not None or fact.ttl_s is not None:
        expiry_time(0.0, fact.expires_at, fact.ttl_s, None)  # range checks only


class Gate(Generic[S, X]):
    """Decides, and optionally commits, batches of facts. Thread-safe per namespace. Generic in
    the concrete store and index (a caller keeps their types); it uses only the ports."""

    def __init__(
        self,
        store: S,
        index: X,
        embedder: Embedder,
        nli: NLI,
        settings: GateSettings | None = None,
        judge: VerdictJudge | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.nli = nli
        self.settings = settings or GateSettings()
        self.judge = judge
        """The judge fitted for these models (:mod:`engine.gate.judge`), if any."""
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    # -- locking -------------------------------------------------------------------------
    @contextmanager
    def namespaces_locked(self, namespaces: set[str]) -> Iterator[None]:
        """Serialise writers per namespace; sorted acquisition cannot deadlock."""
        with self._locks_guard:
            locks = [self._locks[ns] for ns in sorted(namespaces)]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            if hasattr(self.store, "lock_namespaces"):  # across replicas (PostgreSQL)
                stack.enter_context(self.store.lock_namespaces(namespaces))
            yield

    # -- triage --------------------------------------------------------------------------
    def triage(
        self,
        facts: Sequence[Fact],
        policy: Policy | str = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> TriageResult:
        """Decide ``facts`` in order under ``policy`` (``apply``: and commit them). Facts given
        as :class:`~engine.types.ValidFacts` and a :class:`Policy` object were checked and
        resolved at the edge; plain facts and a policy name are checked and resolved here."""
        pol = (
            policy
            if isinstance(policy, Policy) and not overrides
            else self.policy(policy, overrides)
        )
        if len(facts) > self.settings.max_batch:
            raise InvalidInput(
                f"batch of {len(facts)} facts; the limit is {self.settings.max_batch}"
            )
        if not isinstance(facts, ValidFacts):
            for fact in facts:
                validate_fact(fact, self.settings)
        if not facts:
            return TriageResult(decisions=[])
        if not apply:
            return self._triage_replays(facts, pol, apply=False)
        with self.namespaces_locked({f.namespace for f in facts}):
            return self._triage_replays(facts, pol, apply=True)

    def policy(self, policy: Policy | str, overrides: dict[str, Any] | None = None) -> Policy:
        """``policy`` as this gate runs it: a named one with its models' thresholds and its
        judge's bars (:func:`policy_for`), then ``overrides`` (validated)."""
        return policy_for(policy, self.nli, self.embedder, self.judge).with_overrides(overrides)

    # -- idempotent replays ------------------------------------------------------------------
    def _triage_replays(self, facts: Sequence[Fact], pol: Policy, *, apply: bool) -> TriageResult:
        """Set replays aside, decide the rest, and put the replays back in their places. A fact
        whose idempotency key the store holds, or an earlier fact of the batch holds, answers
        that result and takes no part in the decisions (under the namespace locks when
        ``apply``)."""
        recorded = self._recorded(facts)
        first: dict[tuple[str, str], int] = {}
        replay_of: dict[int, int] = {}  # index -> earlier index of this batch with the same key
        for i, fact in enumerate(facts):
            if fact.idempotency_key is None or i in recorded:
                continue
            slot = (fact.namespace, fact.idempotency_key)
            if slot in first:
                replay_of[i] = first[slot]
            else:
                first[slot] = i
        if not recorded and not replay_of:
            return self._triage(facts, pol, apply=apply)
        live = [i for i in range(len(facts)) if i not in recorded and i not in replay_of]
        rest = facts.pick(live) if isinstance(facts, ValidFacts) else [facts[i] for i in live]
        result = self._triage(rest, pol, apply=apply) if live else TriageResult(decisions=[])
        decided = dict(zip(live, result.decisions, strict=True))
        decisions: list[Decision] = []
        for i, fact in enumerate(facts):
            if i in recorded:
                r = recorded[i]
                d = Decision(r.action, fact, r.target_id, (), pol.name, Rule.REPLAYED)
                d = dc_replace(d, memory_id=r.memory_id, review_id=r.review_id, replayed=True)
                decisions.append(d)
            elif i in replay_of:
                d = decided[replay_of[i]]
                decisions.append(dc_replace(d, fact=fact, replayed=True))
            else:
                decisions.append(decided[i])
        result.decisions = decisions
        return result

    def _recorded(self, facts: Sequence[Fact]) -> dict[int, WriteResult]:
        """The store's recorded result for every fact whose idempotency key it already holds."""
        keys: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for i, fact in enumerate(facts):
            if fact.idempotency_key is not None:
                keys[fact.namespace].append((i, fact.idempotency_key))
        out: dict[int, WriteResult] = {}
        for ns, slots in keys.items():
            found = self.store.idempotent_results(ns, [key for _, key in slots])
            for i, key in slots:
                r = found.get(key)
                if r is not None:
                    out[i] = r
        return out

    def _triage(self, facts: Sequence[Fact], pol: Policy, *, apply: bool) -> TriageResult:
        """plan -> embed -> recall -> relate -> evidence -> score -> decide -> commit."""
        timings: dict[str, float] = {}
        probes = plan(facts, pol)
        t0 = time.perf_counter()
        vectors = embed(probes, self.embedder, getattr(facts, "encoded", None))
        timings["embed"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        recall(probes, self.store, self.index, pol.top_k)
        timings["search"] = time.perf_counter() - t0
        decisions, pairs = decide_recalled(
            probes, self.embedder, self.nli, pol, self.store.active_by_key, timings, self.judge
        )
        if apply:
            t0 = time.perf_counter()
            decisions = commit(self.store, self.index, decisions, vectors, pol.name, pol.ttl_for)
            timings["store"] = time.perf_counter() - t0
        return TriageResult(decisions=decisions, timings=timings, nli_pairs=pairs)

    # -- reads and corrections -------------------------------------------------------------
    def get(self, namespace: str, memory_id: str, as_of: AsOf | None = None) -> Memory | None:
        """The memory (any status), or as it was at ``as_of`` (None: it did not exist yet)."""
        if as_of is None:
            return self.store.get(namespace, memory_id)
        return reads.get_at(self.store, namespace, memory_id, as_of)

    def history(self, namespace: str, memory_id: str, as_of: AsOf | None = None) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first; with ``as_of``, its
        memories that existed then, with their status then."""
        chain = list(self.store.history(namespace, memory_id))
        if as_of is None:
            return chain
        then = reads.history_at(self.store, namespace, chain, as_of)
        if all(m.id != memory_id for m in then):
            raise NotFound(f"no memory {memory_id} in this namespace at that point")
        return then

    def recall(
        self,
        namespace: str,
        query: str,
        k: int = 10,
        *,
        as_of: AsOf | None = None,
        include_inactive: bool = False,
    ) -> reads.Hits:
        """The ``k`` memories active now (or at ``as_of``) most similar to ``query``, as
        ``(memory, similarity)`` best first, with what it hid (``.hidden``) and the point it
        read (``.seq``); ``include_inactive``: the ``k`` best of every memory, with status
        (:mod:`engine.reads`)."""
        validate_fact(Fact(namespace=namespace, text=query), self.settings)
        if not 1 <= k <= 1000:
            raise InvalidInput("k must be in [1, 1000]")
        vec = self.embedder.embed([query])
        return reads.recall_hits(
            self.store,
            self.index,
            namespace,
            vec,
            k,
            as_of=as_of,
            include_inactive=include_inactive,
            max_inactive_scan=self.settings.max_inactive_scan,
        )

    def expire(self, limit: int | None = None) -> list[Expired]:
        """One step of the expiry sweep: mark up to ``limit`` (``expiry_batch``) memories past
        their ``expires_at`` expired in one transaction, then drop them from the index."""
        limit = self.settings.expiry_batch if limit is None else limit
        due = self.store.due_namespaces(limit)
        if not due:
            return []
        with self.namespaces_locked(set(due)):
            expired = self.store.expire_due(limit, due)
            by_ns: dict[str, list[int]] = defaultdict(list)
            for e in expired:
                by_ns[e.namespace].append(e.rowid)
            for ns, rowids in by_ns.items():
                self.index.remove(ns, _rowids(*rowids))
        return expired

    def forget(self, namespace: str, memory_id: str) -> str:
        """Erase a memory: its text and embedding are deleted, it leaves the index."""
        with self.namespaces_locked({namespace}):
            self.index.remove(namespace, _rowids(self.store.forget(namespace, memory_id)))
        return memory_id

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        """Undo the replacement made by ``memory_id``: the memory it superseded is active again."""
        with self.namespaces_locked({namespace}):
            res = self.store.undo(namespace, memory_id)
            self.index.remove(namespace, _rowids(res.undone_rowid))
            if res.restored_embedding is not None:
                vec = res.restored_embedding[None, :]
                self.index.add(namespace, _rowids(res.restored_rowid), vec)
        return res.restored, res.undone

    def list_review(self, namespace: str, limit: int = 100) -> list[ReviewItem]:
        return list(self.store.list_review(namespace, "pending", limit))

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """The namespace's audit log after ``after_seq`` (the store's event log)."""
        return list(self.store.events(namespace, after_seq, limit))

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> ReviewResolution:
        """accept = replace the target, keep_both = add, reject = discard."""
        if resolution not in ("accept", "keep_both", "reject"):
            raise InvalidInput("resolution must be accept, keep_both or reject")
        with self.namespaces_locked({namespace}):
            res = self.store.resolve_review(namespace, review_id, cast(Resolution, resolution))
            if res.rowid is not None and res.embedding is not None:
                self.index.add(namespace, _rowids(res.rowid), res.embedding[None, :])
            if res.superseded_rowid is not None:
                self.index.remove(namespace, _rowids(res.superseded_rowid))
        return res

    def ingest(self, facts: Sequence[Fact]) -> list[Decision]:
        """Store facts as they are, without a gate decision (trusted imports, eval set-up)."""
        for fact in facts:
            validate_fact(fact, self.settings)
        if not facts:
            return []
        vectors = self.embedder.embed([f.text for f in facts])
        decisions = [
            Decision("add", f, None, (), "ingest", "ingest", memory_id=new_memory_id())
            for f in facts
        ]
        with self.namespaces_locked({f.namespace for f in facts}):
            return commit(self.store, self.index, decisions, vectors, "ingest")


def policy_for(
    policy: Policy | str, nli: NLI, embedder: Embedder, judge: VerdictJudge | None = None
) -> Policy:
    """A named policy with the thresholds of these models (:mod:`engine.gate.thresholds`) and
    the bars of their judge; a :class:`Policy` object is taken as it is."""
    if not isinstance(policy, str):
        return policy
    named = policy_by_name(policy)
    if not named.model_bars:  # the seed policies: the published figures, on every model
        return named
    pol = for_model(named, _model_name(nli))
    pol = for_embedder(pol, _model_name(embedder))
    return pol if judge is None else judge.policy(pol)


def decide_recalled(
    probes: Sequence[Probe],
    embedder: Embedder,
    nli: NLI,
    pol: Policy,
    active_by_key: ActiveByKey,
    timings: dict[str, float] | None = None,
    judge: VerdictJudge | None = None,
) -> tuple[list[Decision], int]:
    """relate -> evidence -> score -> decide over recalled probes: the decisions and the number
    of NLI pairs scored; ``timings`` gets the ``relate``, ``identify``, ``nli`` and ``decide``
    seconds. Shared by :meth:`Gate.triage` and callers bringing their own candidates."""
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    relate(probes, pol, has_entailment=nli.entailment_index is not None)
    timings["relate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    measure(probes, embedder, pol)  # reads the hits relate sends to the model, and no other
    settle(probes, pol, judged=JUDGED if judge is not None and pol.judge else 0)
    timings["identify"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pairs = score(probes, nli)
    scored(probes)
    timings["nli"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    decisions = decide(probes, pol, active_by_key, judge)
    timings["decide"] = time.perf_counter() - t0
    return decisions, pairs


def _rowids(*rowids: int) -> np.ndarray:
    return np.asarray(rowids, dtype=np.int64)


def _model_name(model: object) -> str | None:
    """The artefact name in a runtime's manifest (None for fakes and foreign scorers)."""
    name = getattr(getattr(model, "manifest", None), "name", None)
    return name if isinstance(name, str) else None
