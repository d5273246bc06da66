"""Reads: recall, get and history, now or as of a point of the event log (below the gate: they
decide nothing; :class:`engine.gate.gate.Gate` serves them).

What "active" means is :mod:`engine.lifecycle`'s rule. **Recall now** ranks the index's active
memories and drops those past their ``expires_at`` (asking for more while fewer than ``k``
survive); it also scores exactly the newest ``max_inactive_scan`` inactive memories that keep an
embedding, to count (``hidden``) or return (``include_inactive``) those that would have ranked
among the ``k``. **Recall as of** a point (seq S, time T) uses the same index plus the log's
delta: only the memories the events after S name can differ from now, and their status at S is
replayed from their own events (:func:`engine.lifecycle.status_at`). Cost: one index search, the
delta's events, and O((delta + scan) x dim) dot products. A forgotten memory stays erased.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Protocol

import numpy as np

from engine.lifecycle import AsOf, Hidden, Hits, State, state_untouched, status_at
from engine.store.base import Store
from engine.types import Memory

__all__ = ["Hits", "Point", "get_at", "history_at", "point", "recall_hits"]

_MAX_SEARCH_K = 1 << 16


class Index(Protocol):
    """The index search a recall needs (``engine.gate.ports.Index`` has it)."""

    def search(self, namespace: str, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores float32 [q, k], rowids int64 [q, k])``; a missing hit has rowid -1."""
        ...


@dataclass(frozen=True)
class Point:
    """A resolved point of a namespace's log and the state there of every memory an event
    after it names (None: the memory did not exist yet)."""

    seq: int
    time: float
    touched: dict[str, State | None]
    erased: int
    """Memories active at the point that are forgotten now (erasure wins: never returned)."""

    def state(self, memory: Memory) -> State | None:
        """``memory``'s state at this point (None: it did not exist yet)."""
        if memory.id in self.touched:
            return self.touched[memory.id]
        return state_untouched(memory.status, memory.expires_at, memory.inactive_since, self.time)


def point(store: Store, namespace: str, as_of: AsOf) -> Point:
    """Resolve ``as_of`` and replay the memories the log's delta names."""
    seq, time = store.as_of_point(namespace, as_of)
    ids = store.touched_since(namespace, seq)
    events = store.lifecycle_events(namespace, ids)
    touched: dict[str, State | None] = {}
    erased = 0
    for memory in store.get_many(namespace, ids):
        forgotten = memory.status == "forgotten"
        mine = events.get(memory.id, [])
        state = status_at(
            memory.id, mine, seq, time, expires_at=memory.expires_at, forgotten_now=forgotten
        )
        touched[memory.id] = state
        if forgotten and state is not None:
            before = status_at(
                memory.id, mine, seq, time, expires_at=memory.expires_at, forgotten_now=False
            )
            erased += before is not None and before.status == "active"
    return Point(seq, time, touched, erased)


def _at(memory: Memory, state: State) -> Memory:
    if memory.status == state.status and memory.inactive_since == state.inactive_since:
        return memory
    return dc_replace(
        memory,
        status=state.status,  # type: ignore[arg-type]
        inactive_since=state.inactive_since,
        superseded_by=memory.superseded_by if state.status == "superseded" else None,
    )


def recall_hits(
    store: Store,
    index: Index,
    namespace: str,
    vec: np.ndarray,
    k: int,
    *,
    as_of: AsOf | None = None,
    include_inactive: bool = False,
    max_inactive_scan: int = 2000,
) -> Hits:
    """The ``k`` memories active at ``as_of`` (now: None) most similar to ``vec`` (one
    L2-normalised query, ``[1, dim]``), with the counts of what was hidden (module doc)."""
    at = None if as_of is None else point(store, namespace, as_of)
    pool: dict[str, tuple[Memory, float, State]] = {}

    def consider(memory: Memory, similarity: float) -> None:
        state = State(memory.status, memory.inactive_since) if at is None else at.state(memory)
        if state is not None and memory.id not in pool:
            pool[memory.id] = (memory, similarity, state)

    search_k = k
    while True:
        scores, rowids = index.search(namespace, vec, search_k)
        found = [(int(r), float(s)) for s, r in zip(scores[0], rowids[0], strict=True) if r >= 0]
        memories = store.memories_for_rowids(namespace, [r for r, _ in found])
        for r, s in found:
            if r in memories:
                consider(memories[r], s)
        active = sum(st.status == "active" for _, _, st in pool.values())
        if active >= k or len(found) < search_k or search_k >= _MAX_SEARCH_K:
            break
        search_k = min(search_k * 4, _MAX_SEARCH_K)  # hits dropped out (expired, too new)

    query = np.asarray(vec, dtype=np.float32).reshape(-1)
    if at is not None:  # active at the point but not now: every one is named by the delta
        alive = [i for i, st in at.touched.items() if st is not None and i not in pool]
        for e in store.embedded(namespace, alive):
            consider(e.memory, float(query @ e.embedding))
    scanned, partial = store.inactive_embedded(namespace, max_inactive_scan)
    for e in scanned:
        if e.memory.id not in pool:
            consider(e.memory, float(query @ e.embedding))

    ranked = sorted(pool.values(), key=lambda entry: -entry[1])
    best = ranked[:k]
    hidden_states = [st.status for _, _, st in best if st.status != "active"]
    hidden = Hidden.of(hidden_states, partial=partial)
    if at is not None and at.erased:
        hidden = dc_replace(hidden, forgotten=hidden.forgotten + at.erased)
    chosen = best if include_inactive else [e for e in ranked if e[2].status == "active"][:k]
    return Hits(
        ((_at(m, st), s) for m, s, st in chosen),
        hidden,
        None if at is None else at.seq,
    )


def get_at(store: Store, namespace: str, memory_id: str, as_of: AsOf) -> Memory | None:
    """The memory as it was at ``as_of``; None when it did not exist yet (or is absent)."""
    found = history_at(store, namespace, [memory_id], as_of)
    return found[0] if found else None


def history_at(
    store: Store, namespace: str, chain: Sequence[str] | Sequence[Memory], as_of: AsOf
) -> list[Memory]:
    """The memories of ``chain`` (ids or memories, in order) that existed at ``as_of``, each
    with its status then. Cost: the events of these memories only."""
    seq, time = store.as_of_point(namespace, as_of)
    ids = [c if isinstance(c, str) else c.id for c in chain]
    memories = {m.id: m for m in store.get_many(namespace, ids)}
    events = store.lifecycle_events(namespace, list(memories))
    out: list[Memory] = []
    for i in ids:
        memory = memories.get(i)
        if memory is None:
            continue
        state = status_at(
            i,
            events.get(i, []),
            seq,
            time,
            expires_at=memory.expires_at,
            forgotten_now=memory.status == "forgotten",
        )
        if state is not None:
            out.append(_at(memory, state))
    return out
