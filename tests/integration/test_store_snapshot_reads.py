"""The store reads index snapshots rely on, on a real SQLiteStore: ``namespace_seq`` grows with
every change of the active set (so a snapshot's staleness is visible), ``active_rowids`` is the
set ``iter_active_embeddings`` returns, ``active_embeddings`` never crosses namespaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.store import SQLiteStore, Write
from engine.types import Fact

DIM = 8
NS, OTHER = "alice", "bob"


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "memgate.db") as s:
        yield s


def same_set(store: SQLiteStore, ns: str) -> list[int]:
    rows, _ = store.iter_active_embeddings(ns)
    active = store.active_rowids(ns)
    assert active.dtype == np.int64 and active.tolist() == rows.tolist()
    return active.tolist()


def test_every_change_of_the_active_set_moves_the_sequence(store: SQLiteStore) -> None:
    assert store.namespace_seq(NS) == 0 and same_set(store, NS) == []
    seqs = [0]

    def moved() -> None:
        now = store.namespace_seq(NS)
        assert now > seqs[-1]
        seqs.append(now)

    first = store.commit([Write("add", Fact(NS, "a"), embedding=vec(1))])[0]
    moved()
    second = store.commit(
        [Write("replace", Fact(NS, "b"), target_id=first.memory_id, embedding=vec(2))]
    )[0]
    moved()
    assert same_set(store, NS) == [second.rowid]
    store.undo(NS, str(second.memory_id))
    moved()
    assert same_set(store, NS) == [first.rowid]
    queued = store.commit(
        [Write("review", Fact(NS, "c"), target_id=first.memory_id, embedding=vec(3))]
    )[0]
    moved()
    resolved = store.resolve_review(NS, str(queued.review_id), "keep_both")
    moved()
    assert same_set(store, NS) == [first.rowid, resolved.rowid]
    store.forget(NS, str(first.memory_id))
    moved()
    store.forget(NS, str(first.memory_id))  # already forgotten: nothing changes
    assert store.namespace_seq(NS) == seqs[-1]
    assert same_set(store, NS) == [resolved.rowid]
    # Another namespace's writes leave this one's sequence alone.
    store.commit([Write("add", Fact(OTHER, "x"), embedding=vec(4))])
    assert store.namespace_seq(NS) == seqs[-1] and store.namespace_seq(OTHER) > 0


def test_active_embeddings_returns_only_active_rows_of_the_namespace(store: SQLiteStore) -> None:
    mine = store.commit([Write("add", Fact(NS, f"m{i}"), embedding=vec(i)) for i in range(4)])
    theirs = store.commit([Write("add", Fact(OTHER, "t"), embedding=vec(9)) for _ in range(1)])
    store.forget(NS, str(mine[1].memory_id))
    asked = [r.rowid for r in mine] + [theirs[0].rowid, -1, 10**9]
    rows, vecs = store.active_embeddings(NS, asked)
    assert rows.tolist() == [mine[0].rowid, mine[2].rowid, mine[3].rowid]
    assert np.allclose(vecs, np.stack([vec(0), vec(2), vec(3)]))
    rows, vecs = store.active_embeddings(NS, [theirs[0].rowid])
    assert rows.tolist() == [] and vecs.shape[0] == 0
