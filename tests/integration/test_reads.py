"""Latest-only and as-of reads, and expiry, through the real gate (real models), on SQLite and
PostgreSQL, with an injected clock (engine.lifecycle, engine.reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import InvalidInput, NotFound
from engine.gate.gate import Gate
from engine.index import IndexManager
from engine.lifecycle import AsOf
from engine.store import SQLiteStore, StoreSettings, Write, open_store
from engine.types import Fact

NS = "acme/u1"
WHERE = "Where does the user live?"


class Clock:
    """The store's injected clock: tests move it by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "reads.db")
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(
    spec: str, clock: Clock, models: tuple[Any, Any]
) -> Iterator[Callable[..., Gate[Any, Any]]]:
    opened: list[Any] = []

    def factory(**settings: Any) -> Gate[Any, Any]:
        store = open_store(spec, StoreSettings(**settings), clock=clock)
        opened.append(store)
        embedder, nli = models
        return Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def gate(make: Callable[..., Gate[Any, Any]]) -> Gate[Any, Any]:
    return make()


def write(gate: Gate[Any, Any], text: str, **kw: Any) -> Any:
    [d] = gate.triage([Fact(namespace=NS, text=text, **kw)], "strict", apply=True).decisions
    return d


def texts(hits: list[Any]) -> list[str]:
    return [m.text for m, _ in hits]


def test_denver_then_chicago_as_of_between_returns_denver(
    gate: Gate[Any, Any], clock: Clock
) -> None:
    denver = write(gate, "The user lives in Denver.", key="home city")
    clock.t = 2000.0
    chicago = write(gate, "The user lives in Chicago.", key="home city")
    assert chicago.action == "replace" and chicago.target_id == denver.memory_id
    clock.t = 2500.0

    now = gate.recall(NS, WHERE, 5)
    assert texts(now) == ["The user lives in Chicago."]
    assert now.hidden.superseded == 1 and now.hidden.total == 1 and now.seq is None

    then = gate.recall(NS, WHERE, 5, as_of=AsOf(time=1500.0))
    assert texts(then) == ["The user lives in Denver."]
    assert then[0][0].status == "active" and then[0][0].superseded_by is None
    assert then.hidden.total == 0  # Chicago did not exist yet: nothing was hidden

    both = gate.recall(NS, WHERE, 5, include_inactive=True)
    assert {m.text: m.status for m, _ in both} == {
        "The user lives in Chicago.": "active",
        "The user lives in Denver.": "superseded",
    }
    old = next(m for m, _ in both if m.status == "superseded")
    assert old.inactive_since == 2000.0

    # The same point named by its event seq: the add of Denver.
    [add_event] = [e for e in gate.events(NS) if e.type == "add"]
    by_seq = gate.recall(NS, WHERE, 5, as_of=AsOf(seq=add_event.seq))
    assert texts(by_seq) == ["The user lives in Denver."] and by_seq.seq == add_event.seq
    assert gate.recall(NS, WHERE, 5, as_of=AsOf(seq=0)) == []  # before the first event


def test_get_and_history_as_of(gate: Gate[Any, Any], clock: Clock) -> None:
    denver = write(gate, "The user lives in Denver.", key="home city")
    clock.t = 2000.0
    chicago = write(gate, "The user lives in Chicago.", key="home city")
    then = AsOf(time=1500.0)
    assert gate.get(NS, denver.memory_id).status == "superseded"
    past = gate.get(NS, denver.memory_id, then)
    assert past is not None and past.status == "active" and past.inactive_since is None
    assert gate.get(NS, chicago.memory_id, then) is None  # not written yet
    assert [m.status for m in gate.history(NS, chicago.memory_id)] == ["superseded", "active"]
    chain = gate.history(NS, denver.memory_id, then)
    assert [(m.id, m.status) for m in chain] == [(denver.memory_id, "active")]
    with pytest.raises(NotFound):
        gate.history(NS, chicago.memory_id, then)


def test_undo_and_forget_are_respected_and_erasure_wins(gate: Gate[Any, Any], clock: Clock) -> None:
    denver = write(gate, "The user lives in Denver.", key="home city")
    clock.t = 2000.0
    chicago = write(gate, "The user lives in Chicago.", key="home city")
    clock.t = 3000.0
    gate.undo(NS, chicago.memory_id)
    assert texts(gate.recall(NS, WHERE, 5)) == ["The user lives in Denver."]
    assert texts(gate.recall(NS, WHERE, 5, as_of=AsOf(time=2500.0))) == [
        "The user lives in Chicago."
    ]
    assert texts(gate.recall(NS, WHERE, 5, as_of=AsOf(time=1500.0))) == [
        "The user lives in Denver."
    ]
    now = gate.recall(NS, WHERE, 5)
    assert now.hidden.undone == 1
    assert gate.get(NS, chicago.memory_id, AsOf(time=2500.0)).status == "active"
    assert gate.get(NS, chicago.memory_id).status == "undone"

    clock.t = 4000.0
    gate.forget(NS, denver.memory_id)
    then = gate.recall(NS, WHERE, 5, as_of=AsOf(time=1500.0))
    assert then == [] and then.hidden.forgotten == 1  # erased, even in history
    past = gate.get(NS, denver.memory_id, AsOf(time=1500.0))
    assert past is not None and past.status == "forgotten" and past.text == ""


def test_review_resolve_is_respected(make: Callable[..., Gate[Any, Any]], clock: Clock) -> None:
    gate = make()
    denver = write(gate, "The user lives in Denver.", key="home city")
    clock.t = 2000.0
    text = "The user lives in Chicago."
    [queued] = gate.store.commit(  # queued for a human against Denver
        [
            Write(
                "review",
                Fact(namespace=NS, text=text),
                target_id=denver.memory_id,
                embedding=gate.embedder.embed([text])[0],
                policy="review",
            )
        ]
    )
    clock.t = 3000.0
    res = gate.resolve_review(NS, queued.review_id, "accept")
    assert texts(gate.recall(NS, WHERE, 5)) == ["The user lives in Chicago."]
    assert texts(gate.recall(NS, WHERE, 5, as_of=AsOf(time=2500.0))) == [
        "The user lives in Denver."
    ]
    assert gate.get(NS, res.memory_id, AsOf(time=2500.0)) is None
    assert gate.get(NS, denver.memory_id, AsOf(time=3000.0)).status == "superseded"


def test_expiry_is_lazy_then_swept_and_agrees_with_as_of(
    gate: Gate[Any, Any], clock: Clock
) -> None:
    otp = write(gate, "The one-time passcode is 918273.", ttl_s=60)
    stored = gate.get(NS, otp.memory_id)
    assert stored.expires_at == 1060.0 and stored.status == "active"
    query = "What is the one-time passcode?"
    clock.t = 1030.0
    assert texts(gate.recall(NS, query, 3)) == ["The one-time passcode is 918273."]
    clock.t = 1100.0  # past expiry, not yet swept: hidden lazily
    lazily = gate.recall(NS, query, 3)
    assert lazily == [] and lazily.hidden.expired == 1
    assert gate.get(NS, otp.memory_id).status == "expired"
    assert gate.store.count_active(NS) == 0
    assert texts(gate.recall(NS, query, 3, as_of=AsOf(time=1030.0))) == [
        "The one-time passcode is 918273."
    ]
    # Never a duplicate target: the same fact again is stored anew, not skipped.
    again = write(gate, "The one-time passcode is 918273.", ttl_s=60)
    assert again.action == "add" and again.target_id is None

    expired = gate.expire()
    assert [e.memory_id for e in expired] == [otp.memory_id]
    assert gate.expire() == []
    assert [e.type for e in gate.events(NS)][-1] == "expire"
    assert gate.get(NS, otp.memory_id).status == "expired"
    assert gate.get(NS, otp.memory_id).inactive_since == 1060.0
    # As of before expiry it is there; as of after, it is not; now it is in history.
    assert gate.get(NS, otp.memory_id, AsOf(time=1030.0)).status == "active"
    assert gate.get(NS, otp.memory_id, AsOf(time=1061.0)).status == "expired"
    assert texts(gate.recall(NS, query, 3, as_of=AsOf(time=1030.0))) == [
        "The one-time passcode is 918273."
    ]
    assert gate.recall(NS, query, 3, as_of=AsOf(time=1061.0)) == []
    assert [m.status for m in gate.history(NS, otp.memory_id)] == ["expired"]


def test_expires_at_and_the_policy_default_ttl_per_kind(gate: Gate[Any, Any], clock: Clock) -> None:
    [seat, note] = gate.triage(
        [
            Fact(namespace=NS, text="Seat 14C is on hold for the user.", kind="episodic"),
            Fact(namespace=NS, text="The user prefers aisle seats.", expires_at=5000.0),
        ],
        "strict",
        apply=True,
        overrides={"episodic_ttl_s": 86400.0},
    ).decisions
    assert gate.get(NS, seat.memory_id).expires_at == 1000.0 + 86400.0
    assert gate.get(NS, note.memory_id).expires_at == 5000.0
    plain = write(gate, "The user flies from Denver.")
    assert gate.get(NS, plain.memory_id).expires_at is None
    with pytest.raises(InvalidInput):
        write(gate, "The user likes tea.", ttl_s=-1)
    with pytest.raises(InvalidInput):
        write(gate, "The user likes tea.", ttl_s=5, expires_at=9000.0)


def test_the_sweep_runs_in_bounded_batches(gate: Gate[Any, Any], clock: Clock) -> None:
    facts = [Fact(namespace=NS, text=f"Locker {i} code is {1000 + i}.", ttl_s=10) for i in range(7)]
    gate.ingest(facts)
    clock.t = 2000.0
    sizes = []
    while batch := gate.expire(3):
        sizes.append(len(batch))
    assert sizes == [3, 3, 1]
    assert gate.store.count_active(NS) == 0
    assert sum(e.type == "expire" for e in gate.events(NS)) == 7


def test_thousands_expire_in_bounded_batches_between_writes(
    gate: Gate[Any, Any], clock: Clock
) -> None:
    # The benchmark (benchmarks/bench_expiry.py) sweeps 100k against a live writer; here 2,000
    # (synthetic unit vectors), interleaved with writes, with every batch within its bound.
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((2000, gate.embedder.dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    writes = [
        Write("add", Fact(namespace="acme/holds", text=f"Hold {i}.", ttl_s=60), embedding=v)
        for i, v in enumerate(vecs)
    ]
    results = gate.store.commit(writes)
    gate.index.add("acme/holds", np.asarray([r.rowid for r in results], dtype=np.int64), vecs)
    clock.t = 5000.0
    sizes = []
    while batch := gate.expire(250):
        sizes.append(len(batch))
        gate.ingest([Fact(namespace=NS, text=f"Booking {len(sizes)} is confirmed.")])
    assert sizes == [250] * 8
    assert gate.store.count_active("acme/holds") == 0
    assert gate.store.count_active(NS) == 8
    assert gate.index.search("acme/holds", vecs[:1], 5)[1][0].tolist() == [-1] * 5


def test_as_of_cost_is_bounded(make: Callable[..., Gate[Any, Any]], clock: Clock) -> None:
    gate = make(max_as_of_events=3)
    gate.ingest([Fact(namespace=NS, text=f"Fact number {i}.") for i in range(5)])
    assert len(gate.recall(NS, "fact", 10, as_of=AsOf(seq=10**6))) == 5
    with pytest.raises(InvalidInput, match="max_as_of_events"):
        gate.recall(NS, "fact", 10, as_of=AsOf(seq=0))


# -- schema 1 -> 2 (expiry and as-of reads add columns, a status and indexes) ---------------

# The SQLite schema of version 1, as released: a store written by an older engine.
_V1_SCHEMA: tuple[str, ...] = (
    """
    CREATE TABLE memories (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        namespace TEXT NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL,
        key TEXT,
        inferred_key TEXT,
        metadata TEXT NOT NULL,
        source TEXT,
        created_at REAL NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('active', 'superseded', 'forgotten', 'undone')),
        supersedes TEXT REFERENCES memories(id),
        superseded_by TEXT REFERENCES memories(id),
        scores TEXT NOT NULL,
        embedding BLOB
    )
    """,
    "CREATE INDEX memories_ns_status ON memories(namespace, status)",
    "CREATE INDEX memories_ns_key_status ON memories(namespace, key, status)",
    "CREATE INDEX memories_supersedes ON memories(supersedes)",
    """
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        type TEXT NOT NULL,
        memory_id TEXT,
        target_id TEXT,
        policy TEXT,
        scores TEXT NOT NULL,
        created_at REAL NOT NULL
    )
    """,
    "CREATE INDEX events_ns_seq ON events(namespace, seq)",
    "CREATE INDEX events_memory ON events(memory_id)",
    """
    CREATE TABLE reviews (
        id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        fact TEXT NOT NULL,
        inferred_key TEXT,
        policy TEXT NOT NULL,
        embedding BLOB,
        target_id TEXT,
        scores TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('pending', 'accepted', 'kept_both', 'rejected')),
        created_at REAL NOT NULL,
        resolved_at REAL,
        resolved_memory_id TEXT
    )
    """,
    "CREATE INDEX reviews_ns_status ON reviews(namespace, status, created_at)",
    "CREATE INDEX reviews_resolved_memory ON reviews(resolved_memory_id)",
    """
    CREATE TABLE idempotency (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        result TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID
    """,
)


def test_sqlite_version_1_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "v1.db"
    raw = sqlite3.connect(path)
    for statement in _V1_SCHEMA:
        raw.execute(statement)
    raw.execute(
        "INSERT INTO memories (rowid, id, namespace, kind, text, metadata, created_at, status, "
        "scores, embedding) VALUES (7, 'mem_old', ?, 'semantic', 'The user lives in Denver.', "
        "'{}', 5.0, 'active', '{}', ?)",
        (NS, np.ones(4, dtype="<f4").tobytes()),
    )
    raw.execute(
        "INSERT INTO events (namespace, type, memory_id, scores, created_at) "
        "VALUES (?, 'add', 'mem_old', '{}', 5.0)",
        (NS,),
    )
    raw.execute("PRAGMA user_version=1")
    raw.commit()
    raw.close()
    clock = Clock(10.0)
    store = SQLiteStore(path, clock=clock)
    try:
        assert store.pragmas()["user_version"] == 2 and store.pragmas()["foreign_keys"] == 1
        old = store.get(NS, "mem_old")
        assert old is not None and old.status == "active" and old.expires_at is None
        assert store.active_rowids(NS).tolist() == [7]  # rowids kept: indexes stay valid
        assert store.integrity_check()
        assert store.as_of_point(NS, AsOf(time=6.0))[0] == 1
    finally:
        store.close()


def test_postgres_version_1_is_migrated_in_place(pg_dsn: str) -> None:
    import psycopg

    open_store(pg_dsn).close()
    with psycopg.connect(pg_dsn) as conn:  # back to version 1
        conn.execute("ALTER TABLE memories DROP CONSTRAINT memories_status_check")
        conn.execute(
            "ALTER TABLE memories ADD CONSTRAINT memories_status_check "
            "CHECK (status IN ('active', 'superseded', 'forgotten', 'undone'))"
        )
        conn.execute("DROP INDEX memories_due")
        conn.execute("ALTER TABLE memories DROP COLUMN expires_at")
        conn.execute("ALTER TABLE memories DROP COLUMN inactive_since")
        conn.execute("DROP INDEX events_target")
        conn.execute("UPDATE memgate_meta SET schema_version = 1")
    clock = Clock(1000.0)
    with open_store(pg_dsn, clock=clock) as store:
        [r] = store.commit([_add("The code is 42.", ttl_s=5)])
        clock.t = 2000.0
        assert [e.memory_id for e in store.expire_due(10)] == [r.memory_id]
        assert store.integrity_check()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT schema_version FROM memgate_meta").fetchone() == (2,)


def _add(text: str, **kw: Any) -> Write:
    return Write(
        "add",
        Fact(namespace=NS, text=text, **kw),
        embedding=np.ones(4, dtype=np.float32) / 2,
    )


def test_the_sqlite_connection_lock_is_handed_over_in_order() -> None:
    # The expiry sweep releases and re-takes the store's lock between batches; a FIFO lock
    # lets the writers queued meanwhile in first (benchmarks/bench_expiry.py measures it).
    import threading
    import time

    from engine.store.sqlite import _FairLock

    lock = _FairLock()
    order: list[int] = []

    def worker(i: int) -> None:
        with lock:
            order.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    with lock:
        for i, t in enumerate(threads):
            t.start()
            deadline = time.monotonic() + 30
            while len(lock._waiters) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.001)  # wait until this thread is queued before the next starts
        order.append(-1)
    for t in threads:
        t.join()
    assert order == [-1, 0, 1, 2, 3, 4, 5]
    with lock:  # free again
        pass
