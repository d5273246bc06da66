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
* **Lock waits and holds are bounded.** A writer waits at most ``StoreSettings.lock_timeout_s``
  for a namespace held elsewhere (PostgreSQL's ``lock_timeout``), then fails with
  ``NamespaceBusy`` naming it (UNAVAILABLE, retryable). A holder that stops talking loses the
  lock: ``idle_in_transaction_session_timeout`` (``StoreSettings.lock_hold_s``) ends the
  session of a frozen replica, and TCP keepalives on both ends (libpq's ``keepalives_*``, the
  server's ``tcp_keepalives_*``) end one cut off by the network. A live holder renews its
  lease: a heartbeat runs ``SELECT 1`` in each held transaction every few seconds, so a
  decision's model work may outlast the idle bound.
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

The queries are :class:`~engine.store._sql.SQLStore`'s (shared with SQLite); this module holds
the pool, the advisory locks, the error translation and :data:`DIALECT`.

``psycopg`` and ``psycopg_pool`` are imported here and nowhere else. The DSN's password is
never logged nor put in an error: messages name :func:`~engine.store.dsn.mask_dsn` of it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg_pool import ConnectionPool, PoolTimeout

from engine.errors import (
    InvalidInput,
    MemgateError,
    NamespaceBusy,
    StorageError,
    StorageFull,
    StoreUnreachable,
    Unavailable,
)
from engine.store._sql import Dialect, Session, SQLStore
from engine.store.base import StoreSettings
from engine.store.dsn import mask_dsn

__all__ = ["DIALECT", "SCHEMA_VERSION", "PostgresSettings", "PostgresStore"]

SCHEMA_VERSION = 2

# Schema version 2 (expiry and as-of reads): the status check gains ``expired``, memories
# gain ``expires_at`` and ``inactive_since``, and three indexes serve the sweep's due list,
# the events naming a memory as their target and the events of a namespace by time. A
# version-1 database is migrated by running these in place.
_V2: tuple[str, ...] = (
    "ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_status_check",
    "ALTER TABLE memories ADD CONSTRAINT memories_status_check "
    "CHECK (status IN ('active', 'superseded', 'forgotten', 'undone', 'expired'))",
    "ALTER TABLE memories ADD COLUMN IF NOT EXISTS expires_at double precision",
    "ALTER TABLE memories ADD COLUMN IF NOT EXISTS inactive_since double precision",
    "CREATE INDEX IF NOT EXISTS memories_due ON memories(expires_at) "
    "WHERE status = 'active' AND expires_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS events_target ON events(target_id)",
    "CREATE INDEX IF NOT EXISTS events_ns_time ON events(namespace, created_at)",
)

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
        status text NOT NULL,
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
    *_V2,
)

# Advisory-lock keys: the schema migration's, and one per namespace (64-bit digests).
_MIGRATION_KEY = 0x6D656D6761746531  # "memgate1"

# The event's seq is the namespace's counter, bumped in the same statement under the
# namespace's lock; namespaces sort by code point (COLLATE "C"), as SQLite's do; id lists
# travel as one array parameter; RETURNING saves the read-back round trips.
DIALECT = Dialect(
    name="postgres",
    placeholder="%s",
    event_sql=(
        "WITH s AS (INSERT INTO namespaces AS n (namespace, seq) VALUES (?, 1) "
        "ON CONFLICT (namespace) DO UPDATE SET seq = n.seq + 1 RETURNING namespace, seq) "
        "INSERT INTO events (namespace, seq, type, memory_id, target_id, policy, scores, "
        "created_at) SELECT s.namespace, s.seq, ?, ?, ?, ?, ?, ? FROM s"
    ),
    seq_sql="SELECT seq FROM namespaces WHERE namespace = ?",
    namespaces_sql='SELECT DISTINCT namespace COLLATE "C" AS ns FROM memories ORDER BY 1',
    review_order="ord",
    max_in=None,
    returning=True,
    skip_empty=True,
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
    lock_timeout_s: float | None = None
    """How long a writer waits for another replica's lock on a namespace before giving up
    with ``NamespaceBusy`` (a retry can succeed). None: ``StoreSettings.lock_timeout_s``."""
    keepalive_idle_s: int = 5
    """TCP keepalives, both ends: seconds of silence before the first probe..."""
    keepalive_interval_s: int = 2
    """...seconds between probes..."""
    keepalive_count: int = 3
    """...and unanswered probes before the connection is dropped (a lost peer is noticed in
    about ``idle + interval x count`` seconds; the server then ends the session and frees its
    locks)."""

    def __post_init__(self) -> None:
        if not 2 <= self.pool_size <= 1000:
            raise InvalidInput(f"pool_size must be in [2, 1000], got {self.pool_size}")
        if not 0.1 <= self.connect_timeout_s <= 600:
            raise InvalidInput(
                f"connect_timeout_s must be in [0.1, 600], got {self.connect_timeout_s}"
            )
        if not 0.1 <= self.wait_s <= 600:
            raise InvalidInput(f"wait_s must be in [0.1, 600], got {self.wait_s}")
        if self.lock_timeout_s is not None and not 0.01 <= self.lock_timeout_s <= 3600:
            raise InvalidInput(f"lock_timeout_s must be in [0.01, 3600], got {self.lock_timeout_s}")
        for name in ("keepalive_idle_s", "keepalive_interval_s", "keepalive_count"):
            value = getattr(self, name)
            if not 1 <= value <= 3600:
                raise InvalidInput(f"{name} must be in [1, 3600], got {value}")


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
    if isinstance(exc, pgerrors.IdleInTransactionSessionTimeout):
        # This replica sat on its namespaces past the hold bound (frozen, cut off): the
        # database ended the session and freed the locks; nothing of it was committed.
        return StoreUnreachable(
            f"{what}: the database ended this transaction after it held its namespaces idle "
            "past the lock-hold bound; nothing was committed, retry"
        )
    if isinstance(exc, pgerrors.TransactionRollback):
        return Unavailable(f"{what}: the transaction was rolled back by the database; retry")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreUnreachable(f"{what}: lost the connection to the store at {where}; retry")
    if isinstance(exc, psycopg.DataError):
        return InvalidInput(f"{what}: the database refused a value ({exc.sqlstate})")
    sqlstate = getattr(exc, "sqlstate", None) or type(exc).__name__
    return StorageError(f"{what} failed: {sqlstate}")


class _Heartbeat:
    """Keeps the lock-holding transactions of this process from looking idle: every ``every``
    seconds each one runs ``SELECT 1`` (a lease renewal). A decision's model work between its
    reads and its commit may then take longer than ``idle_in_transaction_session_timeout``,
    while a frozen process (whose heartbeat freezes with it) still loses its locks by that
    bound, and a cut-off one by it or the TCP keepalives."""

    def __init__(self, every: float) -> None:
        self._every = every
        self._guard = threading.Lock()
        self._held: dict[int, tuple[psycopg.Connection[Any], threading.Lock]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, conn: psycopg.Connection[Any]) -> None:
        with self._guard:
            self._held[id(conn)] = (conn, threading.Lock())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="memgate-store-lease", daemon=True
                )
                self._thread.start()

    def remove(self, conn: psycopg.Connection[Any]) -> None:
        with self._guard:
            entry = self._held.pop(id(conn), None)
        if entry is not None:
            with entry[1]:  # a renewal in progress on it ends first
                pass

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            with self._guard:
                entries = list(self._held.items())
            for key, (conn, busy) in entries:
                with busy:
                    with self._guard:
                        if key not in self._held:
                            continue  # committed meanwhile: the connection is the pool's
                    try:
                        conn.execute("SELECT 1")
                    except psycopg.Error:
                        pass  # the transaction failed or the connection is gone: its owner sees


class _Bound:
    """A write transaction the gate opened with :meth:`PostgresStore.lock_namespaces`."""

    __slots__ = ("conn", "names", "open")

    def __init__(self, conn: psycopg.Connection[Any], names: frozenset[str]) -> None:
        self.conn = conn
        self.names = names
        self.open = True


class PostgresStore(SQLStore):
    """The :class:`~engine.store.base.Store` on a PostgreSQL database, shared by replicas.

    ``dsn`` is a libpq connection string (``postgresql://user:pw@host:port/db``). Opening
    creates the schema if the database has none (one migrating process at a time) and raises
    ``StoreUnreachable`` naming the masked DSN when the server cannot be reached or refuses
    the login. ``clock`` returns the ``created_at`` of new rows. The queries are
    :class:`~engine.store._sql.SQLStore`'s; this class adds the pool, the advisory locks and
    the translation of driver errors.
    """

    dialect = DIALECT

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
        lock_s = settings.lock_timeout_s if pg.lock_timeout_s is None else pg.lock_timeout_s
        self._lock_timeout_s = lock_s
        self._heartbeat = _Heartbeat(min(5.0, settings.lock_hold_s / 3))
        lock_ms = max(1, int(lock_s * 1000))
        hold_ms = max(1000, int(settings.lock_hold_s * 1000))
        ka = (pg.keepalive_idle_s, pg.keepalive_interval_s, pg.keepalive_count)
        options = (
            f"-c lock_timeout={lock_ms} -c idle_in_transaction_session_timeout={hold_ms} "
            f"-c tcp_keepalives_idle={ka[0]} -c tcp_keepalives_interval={ka[1]} "
            f"-c tcp_keepalives_count={ka[2]}"
        )
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pg.pool_size,
            open=False,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(pg.connect_timeout_s)),
                "options": options,
                "keepalives": 1,
                "keepalives_idle": ka[0],
                "keepalives_interval": ka[1],
                "keepalives_count": ka[2],
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
                    if version == 1:
                        for statement in _V2:
                            conn.execute(statement)
                        conn.execute(
                            "UPDATE memgate_meta SET schema_version = %s", (SCHEMA_VERSION,)
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
        self._heartbeat.close()
        self._pool.close()

    @property
    def where(self) -> str:
        """The DSN with its password masked (for messages)."""
        return self._where

    @property
    def failed(self) -> StorageError | None:
        """Always None: a lost connection is retryable (``StoreUnreachable``), not fail-stop."""
        return None

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
        with self._reading("checking integrity") as db:
            gaps = db.one(
                "SELECT COUNT(*) FROM namespaces n WHERE n.seq <> "
                "(SELECT COUNT(*) FROM events e WHERE e.namespace = n.namespace)"
            )
            broken = db.one(
                "SELECT COUNT(*) FROM memories m LEFT JOIN memories s ON s.id = m.superseded_by "
                "WHERE m.status = 'superseded' AND (s.id IS NULL OR s.supersedes <> m.id)"
            )
            forks = db.one(
                "SELECT COUNT(*) FROM (SELECT supersedes FROM memories "
                "WHERE supersedes IS NOT NULL AND status IN ('active', 'superseded') "
                "GROUP BY supersedes HAVING COUNT(*) > 1) f"
            )
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
    def _reading(self, what: str) -> Iterator[Session]:
        """A connection in autocommit mode: each statement reads the newest committed state."""
        self._check_open()
        with self._errors(what), self._pool.connection() as conn:
            yield Session(conn, DIALECT)

    def _lock(self, conn: psycopg.Connection[Any], namespaces: Iterable[str]) -> None:
        """Begin a transaction holding the advisory lock of each namespace, in sorted order;
        ``NamespaceBusy`` naming them when one stays held elsewhere past the lock timeout."""
        conn.execute("BEGIN")
        names = sorted(set(namespaces))
        keys = sorted({namespace_key(ns) for ns in names})
        if not keys:
            return
        try:
            conn.execute(
                "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k ORDER BY k",
                (keys,),
            )
        except pgerrors.LockNotAvailable:
            _rollback(conn)
            shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
            raise NamespaceBusy(
                f"namespace {shown} is locked by another writer (another replica) for more "
                f"than the lock timeout ({self._lock_timeout_s:g} s); nothing was written, retry"
            ) from None

    @contextmanager
    def _transaction(self, what: str, namespaces: Iterable[str]) -> Iterator[Session]:
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
            self._heartbeat.add(conn)
            try:
                yield
            finally:
                self._heartbeat.remove(conn)
                self._local.bound = None
                if bound.open:
                    _rollback(conn)


def _finish(conn: psycopg.Connection[Any]) -> Iterator[Session]:
    """Yield a session of ``conn`` (in an open transaction) to the caller's body, then COMMIT;
    ROLLBACK if the body (or the COMMIT) fails."""
    try:
        yield Session(conn, DIALECT)
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
