"""IndexManager following a real SQLiteStore: the index is a cache of the active memories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.index import IndexManager, IndexSettings
from engine.store import SQLiteStore, Write, WriteResult
from engine.types import Fact

DIM = 16
NS = "alice"


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def add(text: str, seed: int, ns: str = NS) -> Write:
    return Write(action="add", fact=Fact(ns, text), embedding=vec(seed), policy="auto")


def replace(text: str, target: str | None, seed: int) -> Write:
    return Write(
        action="replace", fact=Fact(NS, text), target_id=target, embedding=vec(seed), policy="auto"
    )


def follow(manager: IndexManager, ns: str, results: list[WriteResult], writes: list[Write]) -> None:
    """What the gate does after a commit: mirror the store's changes into the index."""
    for result, write in zip(results, writes, strict=True):
        if result.replayed:
            continue
        if result.superseded_rowid is not None:
            manager.remove(ns, [result.superseded_rowid])
        if result.rowid is not None and write.embedding is not None:
            manager.add(ns, [result.rowid], write.embedding[None, :])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "memgate.db") as s:
        yield s


@pytest.fixture
def manager(store: SQLiteStore) -> IndexManager:
    return IndexManager(store.iter_active_embeddings, IndexSettings(dim=DIM))


def top(manager: IndexManager, store: SQLiteStore, seed: int, ns: str = NS) -> list[str]:
    """Texts of the active memories nearest to vec(seed), best first."""
    _, rowids = manager.search(ns, vec(seed)[None, :], k=5)
    found = store.texts_for_rowids(ns, rowids[0].tolist())
    return [found[r].text for r in rowids[0].tolist() if r in found]


def test_the_index_follows_commits_forget_and_undo(
    store: SQLiteStore, manager: IndexManager
) -> None:
    writes = [add("I eat meat", 1), add("I live in Paris", 2), add("bob's fact", 3, ns="bob")]
    results = store.commit(writes)
    assert top(manager, store, 1)[0] == "I eat meat"  # lazy load sees the commit
    assert manager.stats().namespaces[0].ntotal == 2  # alice only: bob never leaks in

    rep = [replace("I am vegetarian", results[0].memory_id, 4)]
    rep_results = store.commit(rep)
    follow(manager, NS, rep_results, rep)
    assert "I eat meat" not in top(manager, store, 1)
    assert top(manager, store, 4)[0] == "I am vegetarian"

    undo = store.undo(NS, rep_results[0].memory_id or "")
    manager.remove(NS, [undo.undone_rowid])
    assert undo.restored_embedding is not None
    manager.add(NS, [undo.restored_rowid], undo.restored_embedding[None, :])
    assert top(manager, store, 1)[0] == "I eat meat"
    assert "I am vegetarian" not in top(manager, store, 4)

    manager.remove(NS, [store.forget(NS, results[1].memory_id or "")])
    assert "I live in Paris" not in top(manager, store, 2)

    # The cache equals a fresh build from the store.
    rowids, _ = store.iter_active_embeddings(NS)
    fresh = IndexManager(store.iter_active_embeddings, IndexSettings(dim=DIM))
    for seed in range(1, 5):
        _, a = manager.search(NS, vec(seed)[None, :], k=5)
        _, b = fresh.search(NS, vec(seed)[None, :], k=5)
        assert a.tolist() == b.tolist()
    assert manager.stats().namespaces[0].ntotal == len(rowids)


def test_review_resolution_moves_the_index(store: SQLiteStore, manager: IndexManager) -> None:
    [target] = store.commit([add("I live in Paris", 1)])
    queue = Write(
        action="review",
        fact=Fact(NS, "I live in Lyon"),
        target_id=target.memory_id,
        embedding=vec(2),
        policy="review",
    )
    [queued] = store.commit([queue])
    assert top(manager, store, 2) == ["I live in Paris"]  # a queued fact is not recalled
    res = store.resolve_review(NS, queued.review_id or "", "accept")
    assert res.superseded_rowid is not None and res.rowid is not None
    assert res.embedding is not None
    manager.remove(NS, [res.superseded_rowid])
    manager.add(NS, [res.rowid], res.embedding[None, :])
    assert top(manager, store, 2) == ["I live in Lyon"]


def test_a_reopened_store_rebuilds_the_same_index(tmp_path: Path) -> None:
    path = tmp_path / "memgate.db"
    with SQLiteStore(path) as s:
        s.commit([add(f"fact {i}", i) for i in range(30)])
        first = IndexManager(s.iter_active_embeddings, IndexSettings(dim=DIM))
        before = first.search(NS, np.stack([vec(i) for i in range(30)]), k=3)
    with SQLiteStore(path) as s:
        again = IndexManager(s.iter_active_embeddings, IndexSettings(dim=DIM))
        after = again.search(NS, np.stack([vec(i) for i in range(30)]), k=3)
        hits = after[1][:, 0].tolist()
        found = s.texts_for_rowids(NS, hits)
        assert [found[r].text for r in hits] == [f"fact {i}" for i in range(30)]
    np.testing.assert_array_equal(before[1], after[1])
    np.testing.assert_allclose(before[0], after[0])
