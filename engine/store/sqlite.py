"""SQLite store: the source of truth, on one WAL database file.

One connection, guarded by a lock, serves every thread: SQLite serialises writers anyway, and
one connection keeps ``BEGIN IMMEDIATE ... COMMIT`` simple. ``synchronous=FULL`` makes a
returned ``commit`` durable across power loss, not only across a crash of the process.

``sqlite3`` is imported here and nowhere else; its errors are translated at this boundary:
a full disk becomes ``StorageFull``, any other database failure ``StorageError``.

Failures (the fail-stop half of the durability contract): SQLite rolls a transaction back when a
write or sync fails, and the store issues ``ROLLBACK`` too, so a failed call leaves nothing
half-applied. A full disk (``SQLITE_FULL``) is a clean refusal: nothing was written and the
connection stays usable. An I/O error (``SQLITE_IOERR_*``, including a failed ``fsync``) or
corruption *poisons* the store: after a failed ``fsync`` the kernel may already have dropped the
dirty pages, so no later call can trust this connection's view of the file. Every later call
raises ``StorageError`` without touching the file; reopening the store (a restart) recovers from
the WAL, which holds exactly the transactions whose commit completed.

Fault injection: ``SQLiteStore(..., hook=StatementHook())`` is told of every SQL statement the
store runs, before and after it, and may raise what a failing disk makes SQLite raise
(:func:`disk_error`) or end the process (a crash point). Production passes no hook.

The queries are :class:`~engine.store._sql.SQLStore`'s (shared with PostgreSQL); this module
holds the connection, its pragmas, the file's lock, the error translation and :data:`DIALECT`.

Rowids (``memories.rowid``) are the int64 keys of the FAISS index. They are never reused:
memories are never deleted, only their status changes (forget erases text and embedding).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.errors import InvalidInput, NamespaceBusy, StorageError, StorageFull, Unavailable
from engine.store._sql import Dialect, Session, SQLStore
from engine.store.base import StoreSettings

__all__ = ["DIALECT", "SCHEMA_VERSION", "SQLiteStore", "StatementHook", "disk_error"]

SCHEMA_VERSION = 2

# Added by schema version 2 (expiry and as-of reads): the sweep's due list, the events naming
# a memory as their target (as-of replay) and the events of a namespace by time (as_of times).
_V2_INDEXES: tuple[str, ...] = (
    "CREATE INDEX memories_due ON memories(expires_at) "
    "WHERE status = 'active' AND expires_at IS NOT NULL",
    "CREATE INDEX events_target ON events(target_id)",
    "CREATE INDEX events_ns_time ON events(namespace, created_at)",
)

_SCHEMA: tuple[str, ...] = (
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
            CHECK (status IN ('active', 'superseded', 'forgotten', 'undone', 'expired')),
        supersedes TEXT REFERENCES memories(id),
        superseded_by TEXT REFERENCES memories(id),
        scores TEXT NOT NULL,
        embedding BLOB,
        expires_at REAL,
        inactive_since REAL
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
    *_V2_INDEXES,
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

# Events take their seq from AUTOINCREMENT (never reused); SQLite's BINARY collation sorts
# namespaces by code point; chunks of 500 ids keep IN lists far below the parameter limit.
DIALECT = Dialect(
    name="sqlite",
    placeholder="?",
    event_sql=(
        "INSERT INTO events (namespace, type, memory_id, target_id, policy, scores, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    ),
    seq_sql="SELECT COALESCE(MAX(seq), 0) FROM events WHERE namespace = ?",
    namespaces_sql="SELECT DISTINCT namespace FROM memories ORDER BY 1",
    review_order="rowid",
    max_in=500,
    returning=False,
    skip_empty=False,
)


# Primary result codes after which the connection's view of the file cannot be trusted.
_POISONING = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_CANTOPEN,
    }
)


def _primary(exc: sqlite3.Error) -> int | None:
    """The primary result code of ``exc`` (None where sqlite3 does not say)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _is_full(exc: sqlite3.Error) -> bool:
    code = _primary(exc)
    if code is not None:
        return code == sqlite3.SQLITE_FULL
    return "database or disk is full" in str(exc).lower()


def _poisons(exc: sqlite3.Error) -> bool:
    """An I/O error or corruption: later calls must not use this connection."""
    code = _primary(exc)
    if code is not None:
        return code in _POISONING
    text = str(exc).lower()
    return "disk i/o error" in text or "malformed" in text or "not a database" in text


def _is_busy(exc: sqlite3.Error) -> bool:
    code = _primary(exc)
    if code is not None:
        return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "database is locked" in str(exc).lower()


def _translate(
    exc: sqlite3.Error, what: str, namespaces: Iterable[str] = ()
) -> StorageError | Unavailable:
    """Map a sqlite3 error onto the memgate hierarchy, without leaking paths or SQL.

    A lock held by another process past ``busy_timeout_ms`` (a second engine, a backup) is
    ``NamespaceBusy`` (``Unavailable``) naming the write's namespaces: nothing was written, a
    retry can succeed, and it is no reason to stop."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    if _is_busy(exc):
        names = sorted(set(namespaces))
        shown = f" (namespace {', '.join(repr(n) for n in names[:5])})" if names else ""
        return NamespaceBusy(f"{what}{shown}: the database is locked by another process; retry")
    if _is_full(exc):
        return StorageFull(f"{what}: the database or disk is full")
    return StorageError(f"{what} failed: {name}")


_DISK_ERRORS: dict[str, tuple[str, int, str]] = {
    "io": ("disk I/O error", 778, "SQLITE_IOERR_WRITE"),
    "fsync": ("disk I/O error", 1034, "SQLITE_IOERR_FSYNC"),
    "full": ("database or disk is full", sqlite3.SQLITE_FULL, "SQLITE_FULL"),
}


def disk_error(kind: str) -> Exception:
    """The exception SQLite raises for a failing disk, for a :class:`StatementHook` to raise.

    ``io``: a failed write (``SQLITE_IOERR_WRITE``, what an ``EIO`` or ``EFBIG`` write gives);
    ``fsync``: a failed sync (``SQLITE_IOERR_FSYNC``); ``full``: no space (``SQLITE_FULL``).
    """
    if kind not in _DISK_ERRORS:
        raise InvalidInput(f"disk error kind must be one of {sorted(_DISK_ERRORS)}, got {kind!r}")
    message, code, name = _DISK_ERRORS[kind]
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code
    exc.sqlite_errorname = name
    return exc


class StatementHook:
    """Fault injection: told of every SQL statement the store runs on its connection.

    ``before(sql)`` runs before the statement is executed, ``after(sql)`` once it returned
    (``after("COMMIT")``: the transaction is durable). Either may raise (:func:`disk_error`:
    the store handles it exactly like a real failure of the disk) or end the process (a crash
    point). This base class does nothing; tests subclass it.
    """

    def before(self, sql: str) -> None:
        """Called before ``sql`` runs."""

    def after(self, sql: str) -> None:
        """Called after ``sql`` ran without error."""


class _Connection(sqlite3.Connection):
    """A connection that tells its :class:`StatementHook` of every ``execute``."""

    hook: StatementHook | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        hook = self.hook
        if hook is None:
            return super().execute(sql, parameters)
        hook.before(sql)
        cursor = super().execute(sql, parameters)
        hook.after(sql)
        return cursor


def _migrate_v1(db: Session) -> None:
    """Schema 1 -> 2: ``memories`` gains ``expires_at``, ``inactive_since`` and the
    ``expired`` status. SQLite cannot alter a CHECK constraint, so the table is rebuilt (the
    documented 12-step way: the new table is filled, the old one dropped, the new renamed);
    rowids and ids are copied unchanged, so indexes and snapshots stay valid."""
    create = next(s for s in _SCHEMA if "CREATE TABLE memories" in s)
    db.run(create.replace("CREATE TABLE memories", "CREATE TABLE memories_v2"))
    columns = (
        "rowid, id, namespace, kind, text, key, inferred_key, metadata, source, created_at, "
        "status, supersedes, superseded_by, scores, embedding"
    )
    db.run(f"INSERT INTO memories_v2 ({columns}) SELECT {columns} FROM memories")
    db.run("DROP TABLE memories")
    db.run("ALTER TABLE memories_v2 RENAME TO memories")
    for statement in _SCHEMA:  # the table's indexes went with it; the events' are new
        if statement.startswith(("CREATE INDEX memories_", "CREATE INDEX events_")):
            if statement.startswith("CREATE INDEX memories_") or statement in _V2_INDEXES:
                db.run(statement)
    db.run(f"PRAGMA user_version={SCHEMA_VERSION}")


class _FairLock:
    """A lock handed to its waiters in the order they asked (``threading.Lock`` is not fair:
    a thread that releases and asks again, like the expiry sweep between its batches, usually
    gets it back at once). With it, a writer waits for the transactions that were queued
    before it, never for a stream of later ones."""

    __slots__ = ("_guard", "_held", "_waiters")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Lock] = deque()

    def __enter__(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        try:
            turn.acquire()  # released by the holder that hands the lock over
        except BaseException:  # interrupted (KeyboardInterrupt): leave the queue cleanly
            with self._guard:
                if turn in self._waiters:
                    self._waiters.remove(turn)
                    raise
            self.__exit__()  # the lock was handed over meanwhile: pass it on
            raise

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            if self._waiters:
                self._waiters.popleft().release()  # ownership passes on; _held stays True
            else:
                self._held = False


class SQLiteStore(SQLStore):
    """The :class:`~engine.store.base.Store` on one SQLite file (WAL, ``synchronous=FULL``).

    ``clock`` returns the ``created_at`` of new rows (seconds since the epoch); tests pass a
    counter to make time deterministic. ``hook`` is for fault injection only (see
    :class:`StatementHook`). The queries are :class:`~engine.store._sql.SQLStore`'s.
    """

    dialect = DIALECT

    def __init__(
        self,
        path: str | Path,
        settings: StoreSettings = StoreSettings(),  # noqa: B008 - frozen, so sharing is safe
        *,
        clock: Callable[[], float] = time.time,
        hook: StatementHook | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._lock = _FairLock()
        self._closed = False
        self._failed: StorageError | None = None
        try:
            self._conn = sqlite3.connect(
                str(path),
                timeout=settings.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
                factory=_Connection,
            )
        except sqlite3.Error as exc:
            raise _translate(exc, "opening the store") from exc
        self._conn.hook = hook
        try:
            self._configure()
            self._migrate()  # before foreign keys are on: the v1 -> v2 rebuild drops a table
            self._conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def _configure(self) -> None:
        s = self._settings
        try:
            conn = self._conn
            self._enter_wal()
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(s.busy_timeout_ms)}")
            conn.execute(f"PRAGMA wal_autocheckpoint={int(s.wal_autocheckpoint)}")
            if s.max_db_bytes is not None:
                page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                conn.execute(f"PRAGMA max_page_count={max(1, s.max_db_bytes // page)}")
        except sqlite3.Error as exc:
            raise _translate(exc, "configuring the store") from exc

    def _enter_wal(self) -> None:
        """``PRAGMA journal_mode=WAL``, waiting out other openers up to ``busy_timeout_ms``.

        Switching a new file to WAL needs an exclusive lock, and when two processes open
        the same new file at once SQLite answers the loser ``SQLITE_BUSY`` at once, without
        calling the busy handler (waiting could deadlock). Ray actors opening one store
        together hit this; the switch is retried here with backoff instead."""
        deadline = time.monotonic() + self._settings.busy_timeout_ms / 1000
        pause = 0.005
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
                return
            except sqlite3.Error as exc:
                if not _is_busy(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _migrate(self) -> None:
        with self._transaction("creating the schema") as db:
            version = int(db.one("PRAGMA user_version")[0])
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"the store has schema version {version}; this engine knows up to "
                    f"{SCHEMA_VERSION}"
                )
            if version == 0:
                for statement in _SCHEMA:
                    db.run(statement)
                db.run(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version == 1:
                _migrate_v1(db)

    def close(self) -> None:
        """Checkpoint the WAL (best effort) and close. Idempotent.

        A failed (poisoned) store is closed without a checkpoint: copying pages from the WAL
        into the database file is a write, and the next open recovers from the WAL anyway."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._failed is None:
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error:
                    pass  # the data is durable in the WAL; the next open checkpoints it
                except Exception:  # noqa: BLE001 - a hook's fault; closing must still close
                    pass
            self._conn.close()

    @property
    def failed(self) -> StorageError | None:
        """The I/O error that poisoned this store, or None while it is healthy."""
        return self._failed

    def pragmas(self) -> dict[str, Any]:
        """The connection's settings as SQLite reports them (journal mode, synchronous...)."""
        names = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "user_version")
        with self._reading("reading pragmas") as db:
            return {name: db.one(f"PRAGMA {name}")[0] for name in names}

    def integrity_check(self) -> bool:
        """True when SQLite's integrity check and the foreign-key check both pass."""
        with self._reading("checking integrity") as db:
            rows = db.all("PRAGMA integrity_check")
            broken = db.all("PRAGMA foreign_key_check")
        return rows == [("ok",)] and not broken

    # -- plumbing --------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, what: str, namespaces: Iterable[str] = ()) -> Iterator[Session]:
        """One write transaction; rolled back on any error, sqlite3 errors translated.

        ``BEGIN IMMEDIATE`` takes the file's write lock at once, which serialises every
        writer: ``namespaces`` need no lock of their own."""
        with self._session(what, "BEGIN IMMEDIATE", namespaces) as db:
            yield db

    @contextmanager
    def _reading(self, what: str) -> Iterator[Session]:
        # Reads of several statements run in one (deferred) transaction: one snapshot.
        with self._session(what, "BEGIN") as db:
            yield db

    @contextmanager
    def _session(self, what: str, begin: str, namespaces: Iterable[str] = ()) -> Iterator[Session]:
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                conn.execute(begin)
                yield Session(conn, DIALECT)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                error = _translate(exc, what, namespaces)
                if _poisons(exc) and isinstance(error, StorageError):
                    self._failed = error
                raise error from exc
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        # The hook is not told of this ROLLBACK: a failing disk does not fail a rollback
        # (SQLite rolls back from the WAL in memory), and a crash point there adds nothing.
        if self._conn.in_transaction:
            try:
                sqlite3.Connection.execute(self._conn, "ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite already rolled back (e.g. after SQLITE_FULL or SQLITE_IOERR)

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")
        if self._failed is not None:
            raise StorageError(
                "the store failed earlier and accepts no more calls; restart to recover"
            )

    @contextmanager
    def lock_namespaces(self, namespaces: Iterable[str]) -> Iterator[None]:
        """A no-op: one process owns a SQLite file, and its writes are serialised already."""
        yield
