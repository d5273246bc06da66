"""Step 8, ``commit``: every decision in one store transaction, then the indexes follow.

The store is the source of truth: the index moves only after the transaction committed (new and
restored memories are added, superseded ones removed). A write the store recognises as an
idempotent replay returns its first result and moves nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from engine.gate.ports import Index, Store
from engine.store import Write
from engine.types import Decision

__all__ = ["commit"]


def commit(
    store: Store,
    index: Index,
    decisions: Sequence[Decision],
    vectors: np.ndarray,
    policy: str,
    ttl_for: Callable[[str], float | None] | None = None,
) -> list[Decision]:
    """Commit ``decisions``; ``ttl_for(kind)`` is the policy's default TTL of a kind (facts
    that carry no expiry of their own expire that long after they are stored)."""
    writes = [
        Write(
            action=d.action,
            fact=d.fact,
            target_id=d.target_id,
            embedding=vectors[i],
            scores=d.scores(),
            policy=policy,
            inferred_key=d.inferred_key,
            memory_id=d.memory_id,
            default_ttl_s=None if ttl_for is None else ttl_for(d.fact.kind),
        )
        for i, d in enumerate(decisions)
    ]
    results = store.commit(writes)
    adds: dict[str, tuple[list[int], list[np.ndarray]]] = defaultdict(lambda: ([], []))
    removes: dict[str, list[int]] = defaultdict(list)
    out = []
    for i, (d, r) in enumerate(zip(decisions, results, strict=True)):
        ns = d.fact.namespace
        if r.replayed:
            out.append(
                replace(
                    d,
                    action=r.action,
                    target_id=r.target_id,
                    memory_id=r.memory_id,
                    review_id=r.review_id,
                    replayed=True,
                )
            )
            continue
        if r.rowid is not None:
            adds[ns][0].append(r.rowid)
            adds[ns][1].append(vectors[i])
        if r.superseded_rowid is not None:
            removes[ns].append(r.superseded_rowid)
        out.append(replace(d, memory_id=r.memory_id, review_id=r.review_id))
    for ns, (rowids, vecs) in adds.items():
        index.add(ns, np.asarray(rowids, dtype=np.int64), np.stack(vecs))
    for ns, rowids in removes.items():
        index.remove(ns, np.asarray(rowids, dtype=np.int64))
    return out
