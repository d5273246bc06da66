"""The store contract, on both stores: SQLiteStore on a real database file under tmp_path, and
PostgresStore on a fresh database of a real throwaway PostgreSQL server (tests/_pg.py).

Tests that hold for every store take the ``store`` (or ``spec``) fixture and run once per
backend; those about one backend's own machinery (SQLite pragmas and locks, PostgreSQL's
advisory locks) say so in their name."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.store
from engine.errors import Conflict, InvalidInput, NotFound, StorageError, StorageFull, Unavailable
from engine.store import (
    SCHEMA_VERSION,
    SQLiteStore,
    Store,
    StoreSettings,
    Write,
    WriteResult,
    new_memory_id,
    open_store,
)
from engine.types import Fact

DIM = 8
NS = "alice"


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def add(
    text: str,
    ns: str = NS,
    seed: int = 0,
    memory_id: str | None = None,
    key: str | None = None,
    idem: str | None = None,
    **fact: Any,
) -> Write:
    return Write(
        action="add",
        fact=Fact(namespace=ns, text=text, key=key, idempotency_key=idem, **fact),
        embedding=vec(seed),
        scores={"similarity": 0.1, "hypothesis": text.lower()},
        policy="auto",
        inferred_key="user.diet",
        memory_id=memory_id,
    )


def replace(
    text: str, target: str, ns: str = NS, seed: int = 1, memory_id: str | None = None
) -> Write:
    return Write(
        action="replace",
        fact=Fact(namespace=ns, text=text),
        target_id=target,
        embedding=vec(seed),
        scores={"similarity": 0.9, "contradiction": 0.97, "hypothesis": text.lower()},
        policy="auto",
        memory_id=memory_id,
    )


def review(text: str, target: str | None, ns: str = NS, seed: int = 2) -> Write:
    return Write(
        action="review",
        fact=Fact(namespace=ns, text=text, metadata={"by": "test"}, source="chat"),
        target_id=target,
        embedding=vec(seed),
        scores={"similarity": 0.8, "contradiction": 0.7},
        policy="review",
        inferred_key="user.city",
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "memgate.db"


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, path: Path) -> str:
    """What ``open_store`` opens: a SQLite file, or a fresh PostgreSQL database's DSN."""
    if request.param == "sqlite":
        return str(path)
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def store(spec: str) -> Iterator[Store]:
    ticks = itertools.count(1000)
    with open_store(spec, clock=lambda: float(next(ticks))) as s:
        yield s


def dump(spec: str) -> tuple[str, list[Any]]:
    """Everything a store's database holds as text, and every memory's embedding column."""
    if not spec.startswith("postgresql://"):
        raw = sqlite3.connect(spec)
        try:
            rows = raw.execute("SELECT embedding FROM memories ORDER BY rowid").fetchall()
            return "\n".join(raw.iterdump()), [r[0] for r in rows]
        finally:
            raw.close()
    import psycopg

    tables = ("memories", "events", "reviews", "idempotency", "namespaces")
    with psycopg.connect(spec) as conn:
        text = "\n".join(
            str(row[0])
            for t in tables
            for row in conn.execute(f"SELECT t::text FROM {t} t").fetchall()
        )
        rows = conn.execute("SELECT embedding FROM memories ORDER BY rowid").fetchall()
    return text, [r[0] for r in rows]


def one(store: Store, write: Write) -> WriteResult:
    (result,) = store.commit([write])
    return result


def test_public_names_resolve() -> None:
    for name in engine.store.__all__:
        assert getattr(engine.store, name) is not None


def test_implements_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_ids_are_opaque_and_fresh() -> None:
    ids = {new_memory_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("mem_") and len(i) == 28 for i in ids)
    int(next(iter(ids))[4:], 16)


# -- commit ---------------------------------------------------------------------------------


def test_add_stores_an_active_memory_with_its_embedding(store: Store) -> None:
    r = one(store, add("I am vegetarian", key="diet", metadata={"lang": "en"}, source="chat"))
    assert r.action == "add" and r.memory_id and r.rowid is not None and not r.replayed
    m = store.get(NS, r.memory_id)
    assert m is not None
    assert (m.text, m.status, m.key, m.source, m.kind) == (
        "I am vegetarian",
        "active",
        "diet",
        "chat",
        "semantic",
    )
    assert m.metadata == {"lang": "en"}
    assert m.inferred_key == "user.diet"
    assert m.scores["similarity"] == 0.1
    assert m.created_at == 1000.0
    rowids, vecs = store.iter_active_embeddings(NS)
    assert rowids.tolist() == [r.rowid] and rowids.dtype == np.int64
    assert vecs.dtype == np.float32 and vecs.shape == (1, DIM)
    np.testing.assert_array_equal(vecs[0], vec(0))
    [event] = store.events(NS)
    assert (event.type, event.memory_id, event.policy) == ("add", r.memory_id, "auto")


def test_replace_supersedes_the_target(store: Store) -> None:
    old = one(store, add("I eat meat"))
    new = one(store, replace("I am vegetarian", old.memory_id or ""))
    assert new.action == "replace" and new.target_id == old.memory_id
    assert new.superseded_rowid == old.rowid and new.rowid != old.rowid
    before, after = store.get(NS, old.memory_id or ""), store.get(NS, new.memory_id or "")
    assert before is not None and after is not None
    assert (before.status, before.superseded_by) == ("superseded", new.memory_id)
    assert (after.status, after.supersedes) == ("active", old.memory_id)
    assert store.count_active(NS) == 1
    assert store.iter_active_embeddings(NS)[0].tolist() == [new.rowid]
    assert [e.type for e in store.events(NS)] == ["add", "replace"]
    assert store.events(NS)[1].target_id == old.memory_id


def test_skip_logs_only(store: Store) -> None:
    first = one(store, add("I am vegetarian"))
    skip = Write(action="skip", fact=Fact(NS, "I'm vegetarian"), target_id=first.memory_id)
    r = one(store, skip)
    assert (r.action, r.memory_id, r.rowid, r.target_id) == ("skip", None, None, first.memory_id)
    assert store.count_active(NS) == 1
    assert [e.type for e in store.events(NS)] == ["add", "skip"]


def test_review_queues_the_fact(store: Store) -> None:
    target = one(store, add("I live in Paris"))
    r = one(store, review("I live in Lyon", target.memory_id))
    assert r.action == "review" and r.review_id and r.review_id.startswith("rev_")
    assert r.memory_id is None and r.rowid is None
    [item] = store.list_review(NS)
    assert (item.id, item.status, item.target_id) == (r.review_id, "pending", target.memory_id)
    assert item.fact == Fact(NS, "I live in Lyon", metadata={"by": "test"}, source="chat")
    assert store.count_active(NS) == 1
    queued = store.events(NS)[-1]
    assert queued.type == "review_queued" and queued.scores["review_id"] == r.review_id


def test_a_batch_chains_replacements_by_caller_ids(store: Store) -> None:
    a, b = new_memory_id(), new_memory_id()
    results = store.commit([add("plan: free", memory_id=a), replace("plan: pro", a, memory_id=b)])
    assert [r.memory_id for r in results] == [a, b]
    assert results[1].superseded_rowid == results[0].rowid
    assert [m.status for m in store.history(NS, b)] == ["superseded", "active"]


def test_a_failing_write_rolls_back_the_whole_batch(store: Store) -> None:
    kept = one(store, add("I eat meat"))
    gone = one(store, replace("I am vegetarian", kept.memory_id or ""))
    events_before = store.events(NS)
    batch = [
        add("first of batch", idem="k1"),
        review("queued in batch", None),
        replace("replaces a superseded memory", kept.memory_id or ""),  # not active: Conflict
        add("never reached"),
    ]
    with pytest.raises(Conflict):
        store.commit(batch)
    assert store.count_active(NS) == 1
    assert store.events(NS) == events_before
    assert store.list_review(NS) == []
    # The idempotency key of the rolled-back write was not stored: a retry writes for real.
    assert not one(store, add("first of batch", idem="k1")).replayed
    assert store.get(NS, gone.memory_id or "") is not None


def test_replace_of_a_foreign_target_is_a_conflict(store: Store) -> None:
    bob = one(store, add("bob's fact", ns="bob"))
    with pytest.raises(Conflict):
        store.commit([replace("mine now", bob.memory_id or "")])
    bob_memory = store.get("bob", bob.memory_id or "")
    assert bob_memory is not None and bob_memory.status == "active"


def test_a_taken_memory_id_is_a_conflict(store: Store) -> None:
    r = one(store, add("one"))
    with pytest.raises(Conflict):
        store.commit([add("two", memory_id=r.memory_id)])


def test_idempotent_replay_returns_the_first_result(store: Store) -> None:
    first = one(store, add("I am vegetarian", idem="req-1"))
    again = one(store, add("I am vegetarian, retried", idem="req-1"))
    assert again.replayed and not first.replayed
    assert (again.memory_id, again.rowid, again.action) == (
        first.memory_id,
        first.rowid,
        first.action,
    )
    assert store.count_active(NS) == 1
    assert len(store.events(NS)) == 1
    # Keys are per namespace.
    assert not one(store, add("same key, other namespace", ns="bob", idem="req-1")).replayed


def test_idempotent_replay_within_one_batch(store: Store) -> None:
    results = store.commit([add("x", idem="k"), add("x again", idem="k")])
    assert [r.replayed for r in results] == [False, True]
    assert results[0].memory_id == results[1].memory_id
    assert store.count_active(NS) == 1


def test_replayed_review_keeps_its_review_id(store: Store) -> None:
    w = Write(
        action="review",
        fact=Fact(NS, "maybe", idempotency_key="r1"),
        embedding=vec(3),
        policy="review",
    )
    first, again = one(store, w), one(store, w)
    assert again.replayed and again.review_id == first.review_id
    assert len(store.list_review(NS)) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"metadata": {"when": object()}},
        {"metadata": {"x": float("nan")}},
    ],
)
def test_non_json_metadata_is_invalid_and_writes_nothing(store: Store, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        store.commit([add("fine"), add("bad", **bad)])
    assert store.count_active(NS) == 0


def test_numpy_scores_are_stored_as_numbers(store: Store) -> None:
    w = Write(
        action="add",
        fact=Fact(NS, "x"),
        embedding=vec(0),
        scores={"similarity": np.float32(0.5), "n": np.int64(3)},
    )
    m = store.get(NS, one(store, w).memory_id or "")
    assert m is not None and m.scores == {"similarity": 0.5, "n": 3}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"action": "merge", "fact": Fact(NS, "x"), "embedding": vec(0)},
        {"action": "add", "fact": Fact(NS, "x")},
        {"action": "add", "fact": Fact(NS, "x"), "embedding": np.zeros((2, DIM))},
        {"action": "add", "fact": Fact(NS, "x"), "embedding": np.array([np.nan] * DIM)},
        {"action": "add", "fact": Fact("", "x"), "embedding": vec(0)},
        {"action": "add", "fact": Fact(NS, "x", kind="gossip"), "embedding": vec(0)},  # type: ignore[arg-type]
        {"action": "replace", "fact": Fact(NS, "x"), "embedding": vec(0)},
    ],
)
def test_malformed_writes_are_invalid(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        Write(**kwargs)


def test_batch_size_is_capped(spec: str) -> None:
    with open_store(spec, StoreSettings(max_batch=2)) as s:
        with pytest.raises(InvalidInput):
            s.commit([add("a"), add("b"), add("c")])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"busy_timeout_ms": -1},
        {"wal_autocheckpoint": -5},
        {"max_batch": 0},
        {"max_db_bytes": 10},
    ],
)
def test_settings_are_range_checked(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        StoreSettings(**kwargs)


# -- durability -----------------------------------------------------------------------------


def test_reopen_keeps_data_and_embeddings(spec: str) -> None:
    with open_store(spec) as s:
        a = one(s, add("I eat meat", seed=5))
        b = one(s, replace("I am vegetarian", a.memory_id or "", seed=6))
        one(s, review("I live in Lyon", b.memory_id))
    with open_store(spec) as s:
        assert s.integrity_check()
        m = s.get(NS, b.memory_id or "")
        assert m is not None and m.text == "I am vegetarian" and m.supersedes == a.memory_id
        rowids, vecs = s.iter_active_embeddings(NS)
        assert rowids.tolist() == [b.rowid]
        np.testing.assert_array_equal(vecs[0], vec(6))
        assert [e.type for e in s.events(NS)] == ["add", "replace", "review_queued"]
        assert len(s.list_review(NS)) == 1
        # Rowids keep growing after a reopen; they are never reused.
        assert (one(s, add("later")).rowid or 0) > (b.rowid or 0)


def test_sqlite_pragmas_and_plain_file(path: Path) -> None:
    with SQLiteStore(path) as s:
        pragmas = s.pragmas()
        one(s, add("I eat meat", seed=5))
    assert pragmas["journal_mode"] == "wal"
    assert pragmas["synchronous"] == 2  # FULL
    assert pragmas["foreign_keys"] == 1
    assert pragmas["busy_timeout"] == StoreSettings().busy_timeout_ms
    assert pragmas["user_version"] == SCHEMA_VERSION
    with SQLiteStore(path) as s:
        again = s.pragmas()
        assert (again["journal_mode"], again["synchronous"]) == ("wal", 2)
    # The file is a plain SQLite database in WAL mode for any other reader too.
    other = sqlite3.connect(path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("SELECT COUNT(*) FROM memories").fetchone()[0] == 1
    finally:
        other.close()


def test_sqlite_a_newer_schema_is_refused(path: Path) -> None:
    SQLiteStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StorageError):
        SQLiteStore(path)


def test_sqlite_a_full_disk_is_storage_full_and_writes_nothing(path: Path) -> None:
    with SQLiteStore(path, StoreSettings(max_db_bytes=1 << 17)) as s:
        one(s, add("small"))
        big = "x" * 200_000
        with pytest.raises(StorageFull):
            s.commit([add("ok"), add(big)])
        assert s.count_active(NS) == 1
        assert one(s, add("still writable after the failure")).rowid is not None
        assert s.integrity_check()


def test_a_closed_store_is_unavailable(spec: str) -> None:
    s = open_store(spec)
    s.close()
    s.close()
    with pytest.raises(Unavailable):
        s.get(NS, "mem_x")


def test_commits_from_many_threads_all_land(store: Store) -> None:
    threads, per = 8, 25
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per):
                store.commit([add(f"t{t} i{i}", seed=i)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert errors == []
    assert store.count_active(NS) == threads * per
    assert len(store.iter_active_embeddings(NS)[0]) == threads * per
    assert store.integrity_check()


# -- reads ----------------------------------------------------------------------------------


def test_texts_for_rowids_returns_active_memories_only(store: Store) -> None:
    a = one(store, add("I eat meat", key="diet"))
    b = one(store, replace("I am vegetarian", a.memory_id or ""))
    c = one(store, add("bob's", ns="bob"))
    rows = [a.rowid or 0, b.rowid or 0, c.rowid or 0, -1, 10**9]
    found = store.texts_for_rowids(NS, rows)
    assert list(found) == [b.rowid]
    hit = found[b.rowid or 0]
    assert (hit.id, hit.text, hit.key, hit.inferred_key) == (
        b.memory_id,
        "I am vegetarian",
        None,
        None,
    )
    assert store.texts_for_rowids(NS, []) == {}


def test_texts_for_many_rowids(store: Store) -> None:
    results = store.commit([add(f"m{i}", seed=i) for i in range(1200)])
    found = store.texts_for_rowids(NS, [r.rowid or 0 for r in results])
    assert len(found) == 1200 and found[results[777].rowid or 0].text == "m777"


def test_get_many_keeps_order_and_drops_foreign_ids(store: Store) -> None:
    a, b = one(store, add("a")), one(store, add("b"))
    c = one(store, add("c", ns="bob"))
    ids = [b.memory_id or "", "mem_missing", c.memory_id or "", a.memory_id or ""]
    assert [m.text for m in store.get_many(NS, ids)] == ["b", "a"]


def test_active_by_key_returns_the_newest_active(store: Store) -> None:
    a = one(store, add("plan: free", key="plan"))
    found = store.active_by_key(NS, "plan")
    assert found is not None and found.id == a.memory_id
    b = one(
        store,
        Write(
            action="replace",
            fact=Fact(NS, "plan: pro", key="plan"),
            target_id=a.memory_id,
            embedding=vec(1),
        ),
    )
    found = store.active_by_key(NS, "plan")
    assert found is not None and found.id == b.memory_id
    assert store.active_by_key(NS, "timezone") is None
    assert store.active_by_key("bob", "plan") is None


def test_empty_namespace_has_no_embeddings(store: Store) -> None:
    rowids, vecs = store.iter_active_embeddings("nobody")
    assert rowids.shape == (0,) and vecs.shape[0] == 0


def test_namespaces_and_counts(store: Store) -> None:
    store.commit([add("a"), add("b"), add("c", ns="bob")])
    assert store.namespaces() == ["alice", "bob"]
    assert (store.count_active(NS), store.count_active("bob"), store.count_active("x")) == (2, 1, 0)


def test_events_page_by_seq(store: Store) -> None:
    store.commit([add(str(i), seed=i) for i in range(5)])
    store.commit([add("bob", ns="bob")])
    first = store.events(NS, limit=2)
    rest = store.events(NS, after_seq=first[-1].seq)
    assert len(first) == 2 and len(rest) == 3
    seqs = [e.seq for e in first + rest]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert all(e.namespace == NS for e in first + rest)
    with pytest.raises(InvalidInput):
        store.events(NS, limit=0)
    with pytest.raises(InvalidInput):
        store.events(NS, after_seq=-1)


# -- forget / undo / history ----------------------------------------------------------------


def test_forget_erases_text_embedding_and_hypotheses(store: Store, spec: str) -> None:
    r = one(store, add("my password hint is tulip"))
    rowid = store.forget(NS, r.memory_id or "")
    assert rowid == r.rowid
    m = store.get(NS, r.memory_id or "")
    assert m is not None and (m.status, m.text) == ("forgotten", "")
    assert "hypothesis" not in m.scores and m.scores["similarity"] == 0.1
    assert store.count_active(NS) == 0
    assert len(store.iter_active_embeddings(NS)[0]) == 0
    events = store.events(NS)
    assert [e.type for e in events] == ["add", "forget"]
    assert all("hypothesis" not in e.scores for e in events)
    assert store.texts_for_rowids(NS, [rowid]) == {}
    # Erased in the file, not only hidden: no row holds the text or the embedding any more.
    store.close()
    text, embeddings = dump(spec)
    assert "tulip" not in text and embeddings == [None]


def test_forget_is_idempotent(store: Store) -> None:
    r = one(store, add("x"))
    assert store.forget(NS, r.memory_id or "") == store.forget(NS, r.memory_id or "")
    assert [e.type for e in store.events(NS)] == ["add", "forget"]


def test_forget_erases_the_review_that_produced_the_memory(store: Store) -> None:
    q = one(store, review("I live in Lyon", None))
    res = store.resolve_review(NS, q.review_id or "", "keep_both")
    store.forget(NS, res.memory_id or "")
    [item] = store.list_review(NS, status="kept_both")
    assert item.fact.text == ""


def test_forgetting_a_replacement_does_not_restore_the_old_memory(store: Store) -> None:
    a = one(store, add("I eat meat"))
    b = one(store, replace("I am vegetarian", a.memory_id or ""))
    store.forget(NS, b.memory_id or "")
    assert store.count_active(NS) == 0
    with pytest.raises(Conflict):
        store.undo(NS, b.memory_id or "")


def test_undo_restores_the_replaced_memory(store: Store) -> None:
    a = one(store, add("I eat meat", seed=7))
    b = one(store, replace("I am vegetarian", a.memory_id or ""))
    u = store.undo(NS, b.memory_id or "")
    assert (u.restored.id, u.restored.status, u.restored.superseded_by) == (
        a.memory_id,
        "active",
        None,
    )
    assert (u.undone.id, u.undone.status) == (b.memory_id, "undone")
    assert (u.restored_rowid, u.undone_rowid) == (a.rowid, b.rowid)
    assert u.restored_embedding is not None
    np.testing.assert_array_equal(u.restored_embedding, vec(7))
    assert store.iter_active_embeddings(NS)[0].tolist() == [a.rowid]
    assert store.events(NS)[-1].type == "undo"
    # The restored memory can be replaced again.
    c = one(store, replace("I am vegan", a.memory_id or ""))
    assert c.superseded_rowid == a.rowid


def test_undo_conflicts(store: Store) -> None:
    a = one(store, add("v1"))
    with pytest.raises(Conflict):  # replaced nothing
        store.undo(NS, a.memory_id or "")
    b = one(store, replace("v2", a.memory_id or ""))
    c = one(store, replace("v3", b.memory_id or ""))
    with pytest.raises(Conflict):  # not active: superseded by c
        store.undo(NS, b.memory_id or "")
    store.undo(NS, c.memory_id or "")
    with pytest.raises(Conflict):  # already undone
        store.undo(NS, c.memory_id or "")
    with pytest.raises(NotFound):
        store.undo(NS, "mem_missing")
    # The state after the failed undos is the state after the one that worked.
    assert [m.status for m in store.history(NS, a.memory_id or "")] == [
        "superseded",
        "active",
        "undone",
    ]


def test_history_is_the_chain_oldest_first(store: Store) -> None:
    a = one(store, add("plan: free"))
    b = one(store, replace("plan: pro", a.memory_id or ""))
    c = one(store, replace("plan: team", b.memory_id or ""))
    one(store, add("unrelated"))
    for member in (a, b, c):
        chain = store.history(NS, member.memory_id or "")
        assert [m.text for m in chain] == ["plan: free", "plan: pro", "plan: team"]
        assert [m.status for m in chain] == ["superseded", "superseded", "active"]
    with pytest.raises(NotFound):
        store.history(NS, "mem_missing")


# -- review queue ---------------------------------------------------------------------------


def test_accept_replaces_the_target(store: Store) -> None:
    t = one(store, add("I live in Paris"))
    q = one(store, review("I live in Lyon", t.memory_id, seed=9))
    mid = new_memory_id()
    res = store.resolve_review(NS, q.review_id or "", "accept", memory_id=mid)
    assert res.memory_id == mid and res.superseded_rowid == t.rowid and res.rowid is not None
    assert res.review.status == "accepted" and res.review.resolved_memory_id == mid
    assert res.embedding is not None
    np.testing.assert_array_equal(res.embedding, vec(9))
    new = store.get(NS, mid)
    old = store.get(NS, t.memory_id or "")
    assert new is not None and old is not None
    assert (new.text, new.status, new.supersedes, new.inferred_key) == (
        "I live in Lyon",
        "active",
        t.memory_id,
        "user.city",
    )
    assert new.metadata == {"by": "test"} and new.scores["review_id"] == q.review_id
    assert (old.status, old.superseded_by) == ("superseded", mid)
    assert store.list_review(NS) == []
    assert [i.id for i in store.list_review(NS, status="accepted")] == [q.review_id]
    last = store.events(NS)[-1]
    assert (last.type, last.memory_id, last.target_id) == ("review_resolved", mid, t.memory_id)
    assert last.scores["resolution"] == "accept"


def test_keep_both_adds_next_to_the_target(store: Store) -> None:
    t = one(store, add("I like tea"))
    q = one(store, review("I like coffee", t.memory_id))
    res = store.resolve_review(NS, q.review_id or "", "keep_both")
    assert res.superseded_rowid is None and res.rowid is not None
    assert res.review.status == "kept_both"
    assert store.count_active(NS) == 2


def test_reject_discards(store: Store) -> None:
    t = one(store, add("I like tea"))
    q = one(store, review("I hate tea", t.memory_id))
    res = store.resolve_review(NS, q.review_id or "", "reject")
    assert (res.memory_id, res.rowid, res.embedding) == (None, None, None)
    assert res.review.status == "rejected"
    assert store.count_active(NS) == 1
    assert store.events(NS)[-1].type == "review_resolved"


def test_resolving_twice_is_a_conflict(store: Store) -> None:
    q = one(store, review("x", None))
    store.resolve_review(NS, q.review_id or "", "reject")
    with pytest.raises(Conflict):
        store.resolve_review(NS, q.review_id or "", "accept")


def test_accept_of_a_stale_target_is_a_conflict_and_keeps_the_item(store: Store) -> None:
    t = one(store, add("I live in Paris"))
    q = one(store, review("I live in Lyon", t.memory_id))
    one(store, replace("I live in Rome", t.memory_id or ""))
    with pytest.raises(Conflict):
        store.resolve_review(NS, q.review_id or "", "accept")
    assert [i.id for i in store.list_review(NS)] == [q.review_id]
    store.resolve_review(NS, q.review_id or "", "keep_both")


def test_accept_without_target_adds(store: Store) -> None:
    q = one(store, review("x", None))
    res = store.resolve_review(NS, q.review_id or "", "accept")
    assert res.rowid is not None and res.superseded_rowid is None
    assert store.count_active(NS) == 1


def test_bad_resolution_is_invalid(store: Store) -> None:
    q = one(store, review("x", None))
    with pytest.raises(InvalidInput):
        store.resolve_review(NS, q.review_id or "", "maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.list_review(NS, status="open")  # type: ignore[arg-type]


# -- namespace isolation --------------------------------------------------------------------


def test_namespaces_never_see_each_other(store: Store) -> None:
    a = one(store, add("alice v1"))
    b = one(store, replace("alice v2", a.memory_id or ""))
    q = one(store, review("alice review", b.memory_id))
    mine = b.memory_id or ""
    assert store.get("bob", mine) is None
    assert store.get_many("bob", [mine]) == []
    assert store.texts_for_rowids("bob", [b.rowid or 0]) == {}
    assert store.list_review("bob") == [] and store.events("bob") == []
    with pytest.raises(NotFound):
        store.forget("bob", mine)
    with pytest.raises(NotFound):
        store.undo("bob", mine)
    with pytest.raises(NotFound):
        store.history("bob", mine)
    with pytest.raises(NotFound):
        store.resolve_review("bob", q.review_id or "", "accept")
    # Nothing changed for alice.
    m = store.get(NS, mine)
    assert m is not None and m.status == "active"
    assert [i.status for i in store.list_review(NS)] == ["pending"]


def test_sqlite_a_lock_held_by_another_process_is_unavailable_not_fail_stop(tmp_path: Path) -> None:
    # Another writer (a second engine, a backup) holding the lock past busy_timeout_ms:
    # nothing was written, a retry can succeed, and the store must stay usable.
    path = tmp_path / "locked.db"
    store = SQLiteStore(path, StoreSettings(busy_timeout_ms=50))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(Unavailable, match="locked"):
            store.commit([add("Ada likes tea.", idem="k1")])
        other.execute("ROLLBACK")
        [result] = store.commit([add("Ada likes tea.", idem="k1")])
        assert not result.replayed and store.count_active(NS) == 1
    finally:
        other.close()
        store.close()


# -- PostgreSQL's own machinery -----------------------------------------------------------


def test_postgres_a_newer_schema_is_refused(pg_dsn: str) -> None:
    import psycopg

    open_store(pg_dsn).close()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE memgate_meta SET schema_version = schema_version + 1")
    with pytest.raises(StorageError, match="schema version"):
        open_store(pg_dsn)


def test_postgres_a_namespace_locked_by_another_replica_waits_then_is_unavailable(
    pg_dsn: str,
) -> None:
    # Another replica inside its decision for alice holds alice's lock: a writer of alice
    # waits up to lock_timeout_s, then gets a retryable Unavailable; bob is not held up.
    from engine.store.postgres import PostgresSettings, PostgresStore

    with (
        PostgresStore(pg_dsn) as holder,
        PostgresStore(pg_dsn, pg=PostgresSettings(lock_timeout_s=0.2)) as writer,
    ):
        ready, release = threading.Event(), threading.Event()

        def hold() -> None:
            with holder.lock_namespaces({NS}):
                ready.set()
                release.wait(30)

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert ready.wait(30)
            with pytest.raises(Unavailable, match="locked"):
                writer.commit([add("Ada likes tea.", idem="k1")])
            assert not writer.commit([add("bob's", ns="bob")])[0].replayed
        finally:
            release.set()
            t.join(30)
        [result] = writer.commit([add("Ada likes tea.", idem="k1")])
        assert not result.replayed and writer.count_active(NS) == 1


def test_postgres_the_gate_lock_holds_its_commit_in_one_transaction(pg_dsn: str) -> None:
    # Inside lock_namespaces the commit joins the locked transaction: a second replica's
    # commit of the same namespace can only land after it, never between decision and commit.
    from engine.store.postgres import PostgresStore

    with PostgresStore(pg_dsn) as a, PostgresStore(pg_dsn) as b:
        order: list[str] = []
        inside = threading.Event()

        def other() -> None:
            inside.wait(30)
            b.commit([add("from b", seed=2)])
            order.append("b")

        t = threading.Thread(target=other)
        t.start()
        with a.lock_namespaces({NS}):
            inside.set()
            t.join(0.5)  # b is blocked on alice's lock
            assert order == []
            a.commit([add("from a", seed=1)])
            order.append("a")
        t.join(30)
        assert order == ["a", "b"]
        assert [e.seq for e in a.events(NS)] == [1, 2]
        assert a.integrity_check()


def test_postgres_unreachable_is_retryable_and_masks_the_password(pg_cluster: Any) -> None:
    from engine.errors import StoreUnreachable
    from engine.store.postgres import PostgresSettings

    dsn = f"postgresql://memgate:{pg_cluster.password}@127.0.0.1:1/memgate?connect_timeout=1"
    with pytest.raises(StoreUnreachable) as info:
        open_store(dsn, pg=PostgresSettings(connect_timeout_s=1))
    assert pg_cluster.password not in str(info.value)
    assert "postgresql://memgate:***@127.0.0.1:1/memgate" in str(info.value)
    wrong = pg_cluster.dsn().replace(pg_cluster.password, "not-the-password")
    with pytest.raises(StoreUnreachable, match="password") as info:
        open_store(wrong)
    assert "not-the-password" not in str(info.value)
