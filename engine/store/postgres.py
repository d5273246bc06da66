"""PostgreSQL store: the source of truth shared by several memgate replicas.

Every promise of :class:`~engine.store.sqlite.SQLiteStore` holds here: one transaction per
batch, idempotency keys, the event log, the review queue, history, undo and forget with
erasure. What differs is what sharing needs:

* **Writers of one namespace are serialised across processes** by a transaction-level advisory
  lock per namespace (``pg_advisory_xact_lock``), taken in sorted order (no deadlock) at the
  start of every write transaction and released by its COMMIT or ROLLBACK. The gate holds the
  same lock from its decision to its commit (:meth:`PostgresStore.lock_namespaces`): the
  transaction is opened before the gate reads anything and the commit is written into it, so
  no other replica can change the namespace between what a decision saw and what it commits.
  A connection lost in between aborts the transaction and releases the lock: nothing half-done.
* **The event log has a per-namespace sequence**: ``namespaces.seq`` is incremented in the
  same statement that writes an event, under the namespace lock, so a namespace's events are
  committed in ``seq`` order and a reader that has seen ``seq`` never misses an earlier event.
  :meth:`changes_since` lets each replica's FAISS cache catch up on the events it has not seen.
* **A lost database is not a failed disk.** Connection errors, a server restarting, a pool
  that cannot connect are ``StoreUnreachable`` (UNAVAILABLE, retryable): nothing the caller
  was told of is lost (PostgreSQL's COMMIT is durable before it returns), and the pool
  reconnects by itself. ``StorageError`` (fail-stop) is kept for what a retry cannot fix.
* **Embeddings** are float32 little-endian ``bytea`` (no pgvector), so any replica rebuilds an
  index from the store alone.

``psycopg`` and ``psycopg_pool`` are imported here and nowhere else. The DSN's password is
never logged nor put in an error: messages name :func:`~engine.store.factory.mask_dsn` of it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import numpy as np
import psycopg
from psycopg import errors as pgerrors
from psycopg_pool import ConnectionPool, PoolTimeout

from engine.errors import (
    Conflict,
    InvalidInput,
    MemgateError,
    NotFound,
    StorageError,
    StorageFull,
    StoreUnreachable,
    Unavailable,
)
from engine.store._codec import (
    _MEMORY_COLUMNS,
    _RESOLVED_STATUS,
    _REVIEW_COLUMNS,
    _blob,
    _check_limit,
    _check_namespace,
    _dumps,
    _fact,
    _fact_json,
    _loads_dict,
    _memory,
    _result,
    _result_json,
    _review,
    _scrub,
    _stack,
    _vector,
    _wanted,
)
from engine.store.base import (
    RESOLUTIONS,
    REVIEW_STATUSES,
    ActiveText,
    Resolution,
    ReviewResolution,
    ReviewStatus,
    StoreSettings,
    UndoResult,
    Write,
    WriteResult,
    new_memory_id,
    new_review_id,
)
from engine.store.factory import mask_dsn
from engine.types import Event, Memory, ReviewItem

__all__ = ["SCHEMA_VERSION", "PostgresSettings", "PostgresStore"]

SCHEMA_VERSION = 1

_SCHEMA: tuple[str, ...] = (
    """
    CREATE TABLE memgate_meta (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        schema_version integer NOT NULL
    )
    """,
    """
    CREATE TABLE memories (
        rowid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id text NOT NULL UNIQUE,
        namespace text NOT NULL,
        kind text NOT NULL,
        text text NOT NULL,
        key text,
        inferred_key text,
        metadata text NOT NULL,
        source text,
        created_at double precision NOT NULL,
        status text NOT NULL
            CHECK (status IN ('active', 'superseded', 'forgotten', 'undone')),
        supersedes text REFERENCES memories(id),
        superseded_by text REFERENCES memories(id),
        scores text NOT NULL,
        embedding bytea
    )
    """,
    "CREATE INDEX memories_ns_status ON memories(namespace, status)",
    "CREATE INDEX memories_ns_key_status ON memories(namespace, key, status)",
    "CREATE INDEX memories_supersedes ON memories(supersedes)",
    "CREATE TABLE namespaces (namespace text PRIMARY KEY, seq bigint NOT NULL)",
    """
    CREATE TABLE events (
        namespace text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        memory_id text,
        target_id text,
        policy text,
        scores text NOT NULL,
        created_at double precision NOT NULL,
        PRIMARY KEY (namespace, seq)
    )
    """,
    "CREATE INDEX events_memory ON events(memory_id)",
    """
    CREATE TABLE reviews (
        ord bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        id text PRIMARY KEY,
        namespace text NOT NULL,
        fact text NOT NULL,
        inferred_key text,
        policy text NOT NULL,
        embedding bytea,
        target_id text,
        scores text NOT NULL,
        status text NOT NULL
            CHECK (status IN ('pending', 'accepted', 'kept_both', 'rejected')),
        created_at double precision NOT NULL,
        resolved_at double precision,
        resolved_memory_id text
    )
    """,
    "CREATE INDEX reviews_ns_status ON reviews(namespace, status, created_at, ord)",
    "CREATE INDEX reviews_resolved_memory ON reviews(resolved_memory_id)",
    """
    CREATE TABLE idempotency (
        namespace text NOT NULL,
        key text NOT NULL,
        result text NOT NULL,
        created_at double precision NOT NULL,
        PRIMARY KEY (namespace, key)
    )
    """,
)

# Advisory-lock keys: the schema migration's, and one per namespace (64-bit digests).
_MIGRATION_KEY = 0x6D656D6761746531  # "memgate1"

_EVENT_SQL = (
    "WITH s AS (INSERT INTO namespaces AS n (namespace, seq) VALUES (%(ns)s, 1) "
    "ON CONFLICT (namespace) DO UPDATE SET seq = n.seq + 1 RETURNING seq) "
    "INSERT INTO events (namespace, seq, type, memory_id, target_id, policy, scores, "
    "created_at) SELECT %(ns)s, s.seq, %(type)s, %(memory_id)s, %(target_id)s, %(policy)s, "
    "%(scores)s, %(now)s FROM s"
)


@dataclass(frozen=True)
class PostgresSettings:
    """How the PostgreSQL store connects. Every field has a safe default."""

    pool_size: int = 16
    """Most connections this process holds open. The gate holds one from a decision to its
    commit and reads through others, so keep it above twice the concurrent writers."""
    connect_timeout_s: float = 5.0
    """How long opening the store, or a call waiting for a connection, may take before the
    store is reported unreachable (``StoreUnreachable``)."""
    wait_s: float = 2.0
    """How long a call waits for a free or new connection before it fails with
    ``StoreUnreachable`` (short: a lost database must answer UNAVAILABLE within a client's
    deadline, not hang it). Failed reconnections are retried for as long, then afresh by the
    next call, so the store reconnects within about this long once the database is back."""
    lock_timeout_s: float = 60.0
    """How long a writer waits for another replica's lock on a namespace before giving up
    with ``Unavailable`` (a retry can succeed)."""

    def __post_init__(self) -> None:
        if not 2 <= self.pool_size <= 1000:
            raise InvalidInput(f"pool_size must be in [2, 1000], got {self.pool_size}")
        if not 0.1 <= self.connect_timeout_s <= 600:
            raise InvalidInput(
                f"connect_timeout_s must be in [0.1, 600], got {self.connect_timeout_s}"
            )
        if not 0.1 <= self.wait_s <= 600:
            raise InvalidInput(f"wait_s must be in [0.1, 600], got {self.wait_s}")
        if not 0.01 <= self.lock_timeout_s <= 3600:
            raise InvalidInput(f"lock_timeout_s must be in [0.01, 3600], got {self.lock_timeout_s}")


def namespace_key(namespace: str) -> int:
    """The signed 64-bit advisory-lock key of ``namespace`` (stable across processes)."""
    digest = hashlib.blake2b(namespace.encode(), digest_size=8, person=b"memgate-ns").digest()
    return int.from_bytes(digest, "big", signed=True)


def _reason(exc: BaseException, secret: str | None) -> str:
    """The first line of a driver error, with the password cut out should it appear."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if secret:
        text = text.replace(secret, "***")
    return text


def _translate(exc: BaseException, what: str, where: str) -> MemgateError:
    """Map a psycopg / pool error onto the memgate hierarchy, without SQL or passwords."""
    if isinstance(exc, PoolTimeout):
        return StoreUnreachable(f"{what}: no connection to the store at {where}; retry")
    if isinstance(exc, pgerrors.DiskFull):
        return StorageFull(f"{what}: the database server's disk is full")
    if isinstance(exc, pgerrors.LockNotAvailable | pgerrors.QueryCanceled):
        return Unavailable(f"{what}: the namespace is locked by another writer; retry")
    if isinstance(exc, pgerrors.TransactionRollback):
        return Unavailable(f"{what}: the transaction was rolled back by the database; retry")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreUnreachable(f"{what}: lost the connection to the store at {where}; retry")
    if isinstance(exc, psycopg.DataError):
        return InvalidInput(f"{what}: the database refused a value ({exc.sqlstate})")
    sqlstate = getattr(exc, "sqlstate", None) or type(exc).__name__
    return StorageError(f"{what} failed: {sqlstate}")


class _Bound:
    """A write transaction the gate opened with :meth:`PostgresStore.lock_namespaces`."""

    __slots__ = ("conn", "names", "open")

    def __init__(self, conn: psycopg.Connection[Any], names: frozenset[str]) -> None:
        self.conn = conn
        self.names = names
        self.open = True


class PostgresStore:
    """The :class:`~engine.store.base.Store` on a PostgreSQL database, shared by replicas.

    ``dsn`` is a libpq connection string (``postgresql://user:pw@host:port/db``). Opening
    creates the schema if the database has none (one migrating process at a time) and raises
    ``StoreUnreachable`` naming the masked DSN when the server cannot be reached or refuses
    the login. ``clock`` returns the ``created_at`` of new rows.
    """

    shared = True
    """Other processes write this store too: indexes must follow its event log."""

    def __init__(
        self,
        dsn: str,
        settings: StoreSettings = StoreSettings(),  # noqa: B008 - frozen, so sharing is safe
        *,
        pg: PostgresSettings = PostgresSettings(),  # noqa: B008 - frozen
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._pg = pg
        self._clock = clock
        self._where = mask_dsn(dsn)
        self._secret = _password(dsn)
        self._local = threading.local()
        self._closed = False
        self._first_contact(dsn)
        lock_ms = int(pg.lock_timeout_s * 1000)
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pg.pool_size,
            open=False,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(pg.connect_timeout_s)),
                "options": f"-c lock_timeout={lock_ms}",
            },
            check=ConnectionPool.check_connection,
            timeout=pg.wait_s,
            reconnect_timeout=max(2.0, pg.wait_s),
            name="memgate-store",
        )
        try:
            self._pool.open(wait=True, timeout=pg.connect_timeout_s)
            self._migrate()
        except BaseException:
            self._pool.close()
            self._closed = True
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def _first_contact(self, dsn: str) -> None:
        """Connect once directly, so a wrong host, port, password or database is reported
        with the server's reason (the pool would only say it timed out)."""
        try:
            conn = psycopg.connect(dsn, connect_timeout=max(1, int(self._pg.connect_timeout_s)))
        except psycopg.Error as exc:
            raise StoreUnreachable(
                f"cannot open the store at {self._where}: {_reason(exc, self._secret)}"
            ) from None
        conn.close()

    def _migrate(self) -> None:
        with self._errors("creating the schema"), self._pool.connection() as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_KEY,))
                exists = conn.execute("SELECT to_regclass('memgate_meta')").fetchone()
                if exists is not None and exists[0] is not None:
                    row = conn.execute("SELECT schema_version FROM memgate_meta").fetchone()
                    version = int(row[0]) if row is not None else 0
                    if version > SCHEMA_VERSION:
                        raise StorageError(
                            f"the store has schema version {version}; this engine knows up "
                            f"to {SCHEMA_VERSION}"
                        )
                    return
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO memgate_meta (schema_version) VALUES (%s)", (SCHEMA_VERSION,)
                )

    def close(self) -> None:
        """Close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()

    @property
    def where(self) -> str:
        """The DSN with its password masked (for messages)."""
        return self._where

    @property
    def failed(self) -> StorageError | None:
        """Always None: a lost connection is retryable (``StoreUnreachable``), not fail-stop."""
        return None

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether the database answers now (the server's health follows this)."""
        if self._closed:
            return False
        try:
            with self._pool.connection(timeout=timeout_s) as conn:
                conn.execute("SELECT 1")
        except (psycopg.Error, PoolTimeout):
            return False
        return True

    def integrity_check(self) -> bool:
        """True when the log and the chains are consistent: every namespace's events are
        numbered 1..seq without a gap, every superseded memory names an existing successor
        that supersedes it, and no memory is superseded twice."""
        with self._reading("checking integrity") as conn:
            gaps = conn.execute(
                "SELECT COUNT(*) FROM namespaces n WHERE n.seq <> "
                "(SELECT COUNT(*) FROM events e WHERE e.namespace = n.namespace)"
            ).fetchone()
            broken = conn.execute(
                "SELECT COUNT(*) FROM memories m LEFT JOIN memories s ON s.id = m.superseded_by "
                "WHERE m.status = 'superseded' AND (s.id IS NULL OR s.supersedes <> m.id)"
            ).fetchone()
            forks = conn.execute(
                "SELECT COUNT(*) FROM (SELECT supersedes FROM memories "
                "WHERE supersedes IS NOT NULL AND status IN ('active', 'superseded') "
                "GROUP BY supersedes HAVING COUNT(*) > 1) f"
            ).fetchone()
        return all(row is not None and int(row[0]) == 0 for row in (gaps, broken, forks))

    # -- plumbing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            raise _translate(exc, what, self._where) from None

    @contextmanager
    def _reading(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection in autocommit mode: each statement reads the newest committed state."""
        self._check_open()
        with self._errors(what), self._pool.connection() as conn:
            yield conn

    @staticmethod
    def _lock(conn: psycopg.Connection[Any], namespaces: Iterable[str]) -> None:
        """Begin a transaction holding the advisory lock of each namespace, in sorted order."""
        conn.execute("BEGIN")
        keys = sorted({namespace_key(ns) for ns in namespaces})
        if keys:
            conn.execute(
                "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k ORDER BY k",
                (keys,),
            )

    @contextmanager
    def _transaction(
        self, what: str, namespaces: Iterable[str]
    ) -> Iterator[psycopg.Connection[Any]]:
        """One write transaction holding the namespaces' locks; rolled back on any error.

        Inside :meth:`lock_namespaces` (same thread, covered namespaces) the write joins the
        transaction the gate opened, and ends it."""
        self._check_open()
        names = frozenset(namespaces)
        bound: _Bound | None = getattr(self._local, "bound", None)
        if bound is not None and bound.open and names <= bound.names:
            bound.open = False
            with self._errors(what):
                yield from _finish(bound.conn)
            return
        with self._errors(what), self._pool.connection() as conn:
            self._lock(conn, names)
            yield from _finish(conn)

    @contextmanager
    def lock_namespaces(self, namespaces: Iterable[str]) -> Iterator[None]:
        """Hold the namespaces' cross-replica write lock from a decision to its commit.

        Opens a transaction that takes each namespace's advisory lock; the next write of
        these namespaces on this thread (the gate's ``commit``) runs in it and commits it,
        which releases the locks. Leaving without a write rolls it back. Nested calls on
        namespaces already held are no-ops."""
        names = frozenset(namespaces)
        bound: _Bound | None = getattr(self._local, "bound", None)
        if bound is not None:
            if not names <= bound.names:
                raise InvalidInput("lock_namespaces: already holding other namespaces")
            yield
            return
        self._check_open()
        with self._errors("locking namespaces"), self._pool.connection() as conn:
            try:
                self._lock(conn, names)
            except BaseException:
                _rollback(conn)
                raise
            bound = self._local.bound = _Bound(conn, names)
            try:
                yield
            finally:
                self._local.bound = None
                if bound.open:
                    _rollback(conn)

    # -- writes ----------------------------------------------------------------------------

    def commit(self, writes: Sequence[Write]) -> list[WriteResult]:
        """Apply ``writes`` in order in one transaction; on any error nothing is written.

        The same contract as :meth:`SQLiteStore.commit`: later writes see earlier ones, a
        stored idempotency key answers its first result (``replayed=True``), ``Conflict``
        for a replace of a memory not active in its namespace or a taken ``memory_id``.
        """
        if len(writes) > self._settings.max_batch:
            raise InvalidInput(
                f"a commit carries at most {self._settings.max_batch} writes, got {len(writes)}"
            )
        for write in writes:
            if not isinstance(write, Write):
                raise InvalidInput(f"commit takes Write objects, got {type(write).__name__}")
        if not writes:
            return []
        now = self._clock()
        with self._transaction("commit", {w.fact.namespace for w in writes}) as conn:
            return [self._apply(conn, write, now) for write in writes]

    def _apply(self, conn: psycopg.Connection[Any], write: Write, now: float) -> WriteResult:
        fact = write.fact
        ns = fact.namespace
        idem = fact.idempotency_key
        if idem is not None:
            row = conn.execute(
                "SELECT result FROM idempotency WHERE namespace = %s AND key = %s", (ns, idem)
            ).fetchone()
            if row is not None:
                return _result(row[0])
        scores = _dumps(write.scores, "scores")
        if write.action == "add":
            memory_id, rowid = self._insert_memory(conn, write, None, scores, now)
            result = WriteResult("add", memory_id=memory_id, rowid=rowid)
            self._event(conn, ns, "add", memory_id, None, write.policy, scores, now)
        elif write.action == "replace":
            target = cast(str, write.target_id)
            target_rowid = self._active_rowid(conn, ns, target)
            memory_id, rowid = self._insert_memory(conn, write, target, scores, now)
            conn.execute(
                "UPDATE memories SET status = 'superseded', superseded_by = %s WHERE rowid = %s",
                (memory_id, target_rowid),
            )
            result = WriteResult(
                "replace",
                memory_id=memory_id,
                target_id=target,
                rowid=rowid,
                superseded_rowid=target_rowid,
            )
            self._event(conn, ns, "replace", memory_id, target, write.policy, scores, now)
        elif write.action == "skip":
            result = WriteResult("skip", target_id=write.target_id)
            self._event(conn, ns, "skip", None, write.target_id, write.policy, scores, now)
        else:
            review_id = new_review_id()
            conn.execute(
                "INSERT INTO reviews (id, namespace, fact, inferred_key, policy, embedding, "
                "target_id, scores, status, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'pending', %s)",
                (
                    review_id,
                    ns,
                    _fact_json(fact),
                    write.inferred_key,
                    write.policy,
                    _blob(write.embedding),
                    write.target_id,
                    scores,
                    now,
                ),
            )
            result = WriteResult("review", target_id=write.target_id, review_id=review_id)
            event_scores = _dumps({**write.scores, "review_id": review_id}, "scores")
            self._event(
                conn, ns, "review_queued", None, write.target_id, write.policy, event_scores, now
            )
        if idem is not None:
            conn.execute(
                "INSERT INTO idempotency (namespace, key, result, created_at) "
                "VALUES (%s, %s, %s, %s)",
                (ns, idem, _result_json(result), now),
            )
        return result

    @staticmethod
    def _insert_memory(
        conn: psycopg.Connection[Any],
        write: Write,
        supersedes: str | None,
        scores: str,
        now: float,
    ) -> tuple[str, int]:
        fact = write.fact
        memory_id = write.memory_id or new_memory_id()
        row = conn.execute(
            "INSERT INTO memories (id, namespace, kind, text, key, inferred_key, metadata, "
            "source, created_at, status, supersedes, superseded_by, scores, embedding) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'active', %s, NULL, %s, %s) "
            "ON CONFLICT (id) DO NOTHING RETURNING rowid",
            (
                memory_id,
                fact.namespace,
                fact.kind,
                fact.text,
                fact.key,
                write.inferred_key,
                _dumps(fact.metadata, "metadata"),
                fact.source,
                now,
                supersedes,
                scores,
                _blob(write.embedding),
            ),
        ).fetchone()
        if row is None:
            raise Conflict(f"memory id {memory_id} is already taken")
        return memory_id, int(row[0])

    @staticmethod
    def _active_rowid(conn: psycopg.Connection[Any], namespace: str, memory_id: str) -> int:
        row = conn.execute(
            "SELECT rowid, status FROM memories WHERE id = %s AND namespace = %s",
            (memory_id, namespace),
        ).fetchone()
        if row is None or row[1] != "active":
            raise Conflict(f"memory {memory_id} is not active in this namespace")
        return int(row[0])

    @staticmethod
    def _event(
        conn: psycopg.Connection[Any],
        namespace: str,
        type_: str,
        memory_id: str | None,
        target_id: str | None,
        policy: str | None,
        scores: str,
        now: float,
    ) -> None:
        conn.execute(
            _EVENT_SQL,
            {
                "ns": namespace,
                "type": type_,
                "memory_id": memory_id,
                "target_id": target_id,
                "policy": policy,
                "scores": scores,
                "now": now,
            },
        )

    def forget(self, namespace: str, memory_id: str) -> int:
        """Erase a memory (see :meth:`SQLiteStore.forget`): status ``forgotten``, text and
        embedding gone here, in its events' scores and in the review item that produced it."""
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("forget", {namespace}) as conn:
            row = conn.execute(
                "SELECT rowid, status, scores FROM memories WHERE id = %s AND namespace = %s",
                (memory_id, namespace),
            ).fetchone()
            if row is None:
                raise NotFound(f"no memory {memory_id} in this namespace")
            rowid = int(row[0])
            if row[1] == "forgotten":
                return rowid
            conn.execute(
                "UPDATE memories SET status = 'forgotten', text = '', embedding = NULL, "
                "scores = %s WHERE rowid = %s",
                (_dumps(_scrub(_loads_dict(row[2])), "scores"), rowid),
            )
            events = conn.execute(
                "SELECT seq, scores FROM events WHERE memory_id = %s AND namespace = %s",
                (memory_id, namespace),
            ).fetchall()
            for seq, scores in events:
                conn.execute(
                    "UPDATE events SET scores = %s WHERE namespace = %s AND seq = %s",
                    (_dumps(_scrub(_loads_dict(scores)), "scores"), namespace, seq),
                )
            reviews = conn.execute(
                "SELECT id, fact FROM reviews WHERE resolved_memory_id = %s AND namespace = %s",
                (memory_id, namespace),
            ).fetchall()
            for review_id, fact in reviews:
                erased = {**json.loads(fact), "text": ""}
                conn.execute(
                    "UPDATE reviews SET fact = %s, embedding = NULL WHERE id = %s",
                    (_dumps(erased, "fact"), review_id),
                )
            self._event(conn, namespace, "forget", memory_id, None, None, "{}", now)
            return rowid

    def undo(self, namespace: str, memory_id: str) -> UndoResult:
        """Undo the replacement ``memory_id`` made (see :meth:`SQLiteStore.undo`)."""
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("undo", {namespace}) as conn:
            row = conn.execute(
                "SELECT rowid, status, supersedes FROM memories WHERE id = %s AND namespace = %s",
                (memory_id, namespace),
            ).fetchone()
            if row is None:
                raise NotFound(f"no memory {memory_id} in this namespace")
            undone_rowid, status, old_id = int(row[0]), row[1], row[2]
            if status != "active":
                raise Conflict(f"memory {memory_id} is {status}, not active")
            if old_id is None:
                raise Conflict(f"memory {memory_id} replaced nothing")
            old = conn.execute(
                "SELECT rowid, status, superseded_by, embedding FROM memories "
                "WHERE id = %s AND namespace = %s",
                (old_id, namespace),
            ).fetchone()
            if old is None or old[1] != "superseded" or old[2] != memory_id:
                raise Conflict(f"the memory {memory_id} replaced is no longer superseded by it")
            restored_rowid = int(old[0])
            conn.execute("UPDATE memories SET status = 'undone' WHERE rowid = %s", (undone_rowid,))
            conn.execute(
                "UPDATE memories SET status = 'active', superseded_by = NULL WHERE rowid = %s",
                (restored_rowid,),
            )
            self._event(conn, namespace, "undo", memory_id, old_id, None, "{}", now)
            restored = self._memory_by_rowid(conn, restored_rowid)
            undone = self._memory_by_rowid(conn, undone_rowid)
        return UndoResult(
            restored=restored,
            undone=undone,
            restored_rowid=restored_rowid,
            undone_rowid=undone_rowid,
            restored_embedding=_vector(old[3]),
        )

    def resolve_review(
        self,
        namespace: str,
        review_id: str,
        resolution: Resolution,
        memory_id: str | None = None,
    ) -> ReviewResolution:
        """Resolve a pending review item in one transaction (see
        :meth:`SQLiteStore.resolve_review`)."""
        _check_namespace(namespace)
        if resolution not in RESOLUTIONS:
            raise InvalidInput(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
        now = self._clock()
        with self._transaction("resolve_review", {namespace}) as conn:
            row = conn.execute(
                "SELECT fact, inferred_key, policy, embedding, target_id, scores, status "
                "FROM reviews WHERE id = %s AND namespace = %s",
                (review_id, namespace),
            ).fetchone()
            if row is None:
                raise NotFound(f"no review item {review_id} in this namespace")
            fact_json, inferred_key, policy, blob, target_id, scores_json, status = row
            if status != "pending":
                raise Conflict(f"review item {review_id} is already {status}")
            scores = {
                **_loads_dict(scores_json),
                "review_id": review_id,
                "resolution": resolution,
            }
            embedding = _vector(blob)
            new_id: str | None = None
            rowid: int | None = None
            superseded_rowid: int | None = None
            if resolution != "reject":
                replaces = target_id if resolution == "accept" else None
                if replaces is not None:
                    superseded_rowid = self._active_rowid(conn, namespace, replaces)
                write = Write(
                    action="replace" if replaces is not None else "add",
                    fact=_fact(fact_json),
                    target_id=replaces,
                    embedding=embedding,
                    scores=scores,
                    policy=policy,
                    inferred_key=inferred_key,
                    memory_id=memory_id,
                )
                new_id, rowid = self._insert_memory(
                    conn, write, replaces, _dumps(scores, "scores"), now
                )
                if replaces is not None:
                    conn.execute(
                        "UPDATE memories SET status = 'superseded', superseded_by = %s "
                        "WHERE rowid = %s",
                        (new_id, superseded_rowid),
                    )
            item_row = conn.execute(
                "UPDATE reviews SET status = %s, resolved_at = %s, resolved_memory_id = %s "
                f"WHERE id = %s RETURNING {_REVIEW_COLUMNS}",
                (_RESOLVED_STATUS[resolution], now, new_id, review_id),
            ).fetchone()
            event_scores = _dumps({"review_id": review_id, "resolution": resolution}, "scores")
            self._event(
                conn, namespace, "review_resolved", new_id, target_id, policy, event_scores, now
            )
        return ReviewResolution(
            review=_review(cast(Sequence[Any], item_row)),
            memory_id=new_id,
            rowid=rowid,
            superseded_rowid=superseded_rowid,
            embedding=embedding if new_id is not None else None,
        )

    # -- reads -----------------------------------------------------------------------------

    @staticmethod
    def _memory_by_rowid(conn: psycopg.Connection[Any], rowid: int) -> Memory:
        row = conn.execute(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE rowid = %s", (rowid,)
        ).fetchone()
        return _memory(cast(Sequence[Any], row))

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        """The memory, or None when absent or stored under another namespace."""
        _check_namespace(namespace)
        with self._reading("get") as conn:
            row = conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = %s AND namespace = %s",
                (memory_id, namespace),
            ).fetchone()
        return None if row is None else _memory(row)

    def get_many(self, namespace: str, ids: Sequence[str]) -> list[Memory]:
        """The memories found, in the order of ``ids``; absent or foreign ids are left out."""
        _check_namespace(namespace)
        unique = list(dict.fromkeys(ids))
        with self._reading("get_many") as conn:
            rows = conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = %s AND id = ANY(%s)",
                (namespace, unique),
            ).fetchall()
        found = {row[0]: _memory(row) for row in rows}
        return [found[i] for i in ids if i in found]

    def texts_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, ActiveText]:
        """Id, text and keys of the *active* memories of ``namespace`` among ``rowids``."""
        _check_namespace(namespace)
        wanted = _wanted(rowids)
        if not wanted:
            return {}
        with self._reading("texts_for_rowids") as conn:
            rows = conn.execute(
                "SELECT rowid, id, text, inferred_key, key, kind FROM memories "
                "WHERE namespace = %s AND status = 'active' AND rowid = ANY(%s) ORDER BY rowid",
                (namespace, wanted),
            ).fetchall()
        return {
            int(rowid): ActiveText(id_, text, inferred_key, key, kind)
            for rowid, id_, text, inferred_key, key, kind in rows
        }

    def active_by_key(self, namespace: str, key: str) -> Memory | None:
        """The newest active memory of ``namespace`` with the explicit ``key``."""
        _check_namespace(namespace)
        with self._reading("active_by_key") as conn:
            row = conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories "
                "WHERE namespace = %s AND key = %s AND status = 'active' "
                "ORDER BY rowid DESC LIMIT 1",
                (namespace, key),
            ).fetchone()
        return None if row is None else _memory(row)

    def iter_active_embeddings(self, namespace: str) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories, by rowid."""
        _check_namespace(namespace)
        with self._reading("iter_active_embeddings") as conn:
            rows = conn.execute(
                "SELECT rowid, embedding FROM memories "
                "WHERE namespace = %s AND status = 'active' AND embedding IS NOT NULL "
                "ORDER BY rowid",
                (namespace,),
            ).fetchall()
        return _stack(namespace, rows)

    def namespaces(self) -> list[str]:
        """Every namespace that holds a memory (of any status), sorted by code point."""
        with self._reading("namespaces") as conn:
            rows = conn.execute(
                'SELECT DISTINCT namespace COLLATE "C" AS ns FROM memories ORDER BY 1'
            ).fetchall()
        return [r[0] for r in rows]

    def count_active(self, namespace: str) -> int:
        _check_namespace(namespace)
        with self._reading("count_active") as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM memories WHERE namespace = %s AND status = 'active'",
                (namespace,),
            ).fetchone()
        return int(cast(Sequence[Any], row)[0])

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first (undone branches too)."""
        _check_namespace(namespace)
        with self._reading("history") as conn:
            rows = conn.execute(
                f"""
                WITH RECURSIVE up(id, supersedes, depth) AS (
                    SELECT id, supersedes, 0 FROM memories WHERE id = %(id)s AND namespace = %(ns)s
                    UNION
                    SELECT m.id, m.supersedes, up.depth + 1
                    FROM memories m JOIN up ON m.id = up.supersedes
                    WHERE m.namespace = %(ns)s AND up.depth < 1000000
                ),
                root AS (SELECT id FROM up ORDER BY depth DESC LIMIT 1),
                down(id) AS (
                    SELECT id FROM root
                    UNION
                    SELECT m.id FROM memories m JOIN down ON m.supersedes = down.id
                    WHERE m.namespace = %(ns)s
                )
                SELECT {_MEMORY_COLUMNS} FROM memories
                WHERE namespace = %(ns)s AND id IN (SELECT id FROM down)
                ORDER BY rowid
                """,
                {"id": memory_id, "ns": namespace},
            ).fetchall()
        if not rows:
            raise NotFound(f"no memory {memory_id} in this namespace")
        return [_memory(r) for r in rows]

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """The namespace's events with ``seq > after_seq``, oldest first."""
        _check_namespace(namespace)
        _check_limit(limit)
        if after_seq < 0:
            raise InvalidInput(f"after_seq must be >= 0, got {after_seq}")
        with self._reading("events") as conn:
            rows = conn.execute(
                "SELECT seq, namespace, type, memory_id, target_id, policy, scores, created_at "
                "FROM events WHERE namespace = %s AND seq > %s ORDER BY seq LIMIT %s",
                (namespace, after_seq, limit),
            ).fetchall()
        return [
            Event(
                seq=r[0],
                namespace=r[1],
                type=r[2],
                memory_id=r[3],
                target_id=r[4],
                policy=r[5],
                scores=_loads_dict(r[6]),
                created_at=r[7],
            )
            for r in rows
        ]

    def list_review(
        self, namespace: str, status: ReviewStatus = "pending", limit: int = 100
    ) -> list[ReviewItem]:
        """Review items of ``namespace`` with ``status``, oldest first."""
        _check_namespace(namespace)
        _check_limit(limit)
        if status not in REVIEW_STATUSES:
            raise InvalidInput(f"status must be one of {REVIEW_STATUSES}, got {status!r}")
        with self._reading("list_review") as conn:
            rows = conn.execute(
                f"SELECT {_REVIEW_COLUMNS} FROM reviews "
                "WHERE namespace = %s AND status = %s ORDER BY created_at, ord LIMIT %s",
                (namespace, status, limit),
            ).fetchall()
        return [_review(r) for r in rows]

    def idempotent_results(self, namespace: str, keys: Sequence[str]) -> dict[str, WriteResult]:
        """The recorded result of every key of ``keys`` already committed in ``namespace``."""
        _check_namespace(namespace)
        unique = sorted(set(keys))
        if not unique:
            return {}
        with self._reading("idempotent_results") as conn:
            rows = conn.execute(
                "SELECT key, result FROM idempotency WHERE namespace = %s AND key = ANY(%s)",
                (namespace, unique),
            ).fetchall()
        return {key: _result(result) for key, result in rows}

    # -- index snapshots and replicas (engine.index) ---------------------------------------

    def namespace_seq(self, namespace: str) -> int:
        """The namespace's newest event ``seq``; 0 when it has none."""
        _check_namespace(namespace)
        with self._reading("namespace_seq") as conn:
            row = conn.execute(
                "SELECT seq FROM namespaces WHERE namespace = %s", (namespace,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def changes_since(self, namespace: str, after_seq: int) -> tuple[int, np.ndarray]:
        """``(seq, rowids)``: the namespace's newest event seq, and the sorted rowids of every
        memory an event after ``after_seq`` added, replaced, restored or removed. An index
        at ``after_seq`` is current again once it holds exactly the active ones of these."""
        _check_namespace(namespace)
        with self._reading("changes_since") as conn:
            row = conn.execute(
                "SELECT seq FROM namespaces WHERE namespace = %s", (namespace,)
            ).fetchone()
            seq = 0 if row is None else int(row[0])
            if seq <= after_seq:
                return seq, np.empty(0, dtype=np.int64)
            rows = conn.execute(
                "SELECT m.rowid FROM events e JOIN memories m ON m.id = e.memory_id "
                "WHERE e.namespace = %(ns)s AND e.seq > %(after)s AND e.seq <= %(seq)s "
                "UNION SELECT m.rowid FROM events e JOIN memories m ON m.id = e.target_id "
                "WHERE e.namespace = %(ns)s AND e.seq > %(after)s AND e.seq <= %(seq)s "
                "ORDER BY 1",
                {"ns": namespace, "after": after_seq, "seq": seq},
            ).fetchall()
        return seq, np.fromiter((r for (r,) in rows), dtype=np.int64, count=len(rows))

    def active_rowids(self, namespace: str) -> np.ndarray:
        """int64 rowids of the namespace's active memories with an embedding, sorted."""
        _check_namespace(namespace)
        with self._reading("active_rowids") as conn:
            rows = conn.execute(
                "SELECT rowid FROM memories "
                "WHERE namespace = %s AND status = 'active' AND embedding IS NOT NULL "
                "ORDER BY rowid",
                (namespace,),
            ).fetchall()
        return np.fromiter((r for (r,) in rows), dtype=np.int64, count=len(rows))

    def active_embeddings(
        self, namespace: str, rowids: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories of
        ``namespace`` among ``rowids``, by rowid (others left out)."""
        _check_namespace(namespace)
        wanted = _wanted(rowids)
        if not wanted:
            return _stack(namespace, [])
        with self._reading("active_embeddings") as conn:
            rows = conn.execute(
                "SELECT rowid, embedding FROM memories WHERE namespace = %s "
                "AND status = 'active' AND embedding IS NOT NULL AND rowid = ANY(%s) "
                "ORDER BY rowid",
                (namespace, wanted),
            ).fetchall()
        return _stack(namespace, rows)


def _finish(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """Yield ``conn`` (in an open transaction) to the caller's body, then COMMIT; ROLLBACK if
    the body (or the COMMIT) fails."""
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # the connection is gone; the server rolled the transaction back itself


def _password(dsn: str) -> str | None:
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn).get("password")  # type: ignore[return-value]
    except psycopg.Error:
        return None
