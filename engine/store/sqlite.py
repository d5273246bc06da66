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

Rowids (``memories.rowid``) are the int64 keys of the FAISS index. They are never reused:
memories are never deleted, only their status changes (forget erases text and embedding).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import numpy as np

from engine.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    StorageError,
    StorageFull,
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
from engine.types import Event, Memory, ReviewItem

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "StatementHook", "disk_error"]

SCHEMA_VERSION = 1

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

_CHUNK = 500


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


def _translate(exc: sqlite3.Error, what: str) -> StorageError | Unavailable:
    """Map a sqlite3 error onto the memgate hierarchy, without leaking paths or SQL.

    A lock held by another process past ``busy_timeout_ms`` (a second engine, a backup) is
    ``Unavailable``: nothing was written, a retry can succeed, and it is no reason to stop."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    if _is_busy(exc):
        return Unavailable(f"{what}: the database is locked by another process; retry")
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


class SQLiteStore:
    """The :class:`~engine.store.base.Store` on one SQLite file (WAL, ``synchronous=FULL``).

    ``clock`` returns the ``created_at`` of new rows (seconds since the epoch); tests pass a
    counter to make time deterministic. ``hook`` is for fault injection only (see
    :class:`StatementHook`).
    """

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
        self._lock = threading.Lock()
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
            self._migrate()
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
            conn.execute("PRAGMA foreign_keys=ON")
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
        with self._transaction("creating the schema") as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"the store has schema version {version}; this engine knows up to "
                    f"{SCHEMA_VERSION}"
                )
            if version == 0:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

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

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def pragmas(self) -> dict[str, Any]:
        """The connection's settings as SQLite reports them (journal mode, synchronous...)."""
        names = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "user_version")
        with self._reading("reading pragmas") as conn:
            return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

    def integrity_check(self) -> bool:
        """True when SQLite's integrity check and the foreign-key check both pass."""
        with self._reading("checking integrity") as conn:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
        return rows == [("ok",)] and not broken

    # -- plumbing --------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; rolled back on any error, sqlite3 errors translated."""
        with self._session(what, "BEGIN IMMEDIATE") as conn:
            yield conn

    @contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        # Reads of several statements run in one (deferred) transaction: one snapshot.
        with self._session(what, "BEGIN") as conn:
            yield conn

    @contextmanager
    def _session(self, what: str, begin: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                conn.execute(begin)
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                error = _translate(exc, what)
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

    # -- writes ----------------------------------------------------------------------------

    def commit(self, writes: Sequence[Write]) -> list[WriteResult]:
        """Apply ``writes`` in order in one transaction; on any error nothing is written.

        Later writes see earlier ones (a write may replace the memory an earlier one added,
        when the caller assigned its ``memory_id``). A write whose idempotency key is already
        stored returns the stored result with ``replayed=True`` and changes nothing.
        Raises ``Conflict`` when a replace targets a memory that is not active in its
        namespace, or a given ``memory_id`` already exists.
        """
        if len(writes) > self._settings.max_batch:
            raise InvalidInput(
                f"a commit carries at most {self._settings.max_batch} writes, got {len(writes)}"
            )
        for write in writes:
            if not isinstance(write, Write):
                raise InvalidInput(f"commit takes Write objects, got {type(write).__name__}")
        now = self._clock()
        with self._transaction("commit") as conn:
            return [self._apply(conn, write, now) for write in writes]

    def _apply(self, conn: sqlite3.Connection, write: Write, now: float) -> WriteResult:
        fact = write.fact
        ns = fact.namespace
        idem = fact.idempotency_key
        if idem is not None:
            row = conn.execute(
                "SELECT result FROM idempotency WHERE namespace = ? AND key = ?", (ns, idem)
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
                "UPDATE memories SET status = 'superseded', superseded_by = ? WHERE rowid = ?",
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
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
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
                "INSERT INTO idempotency (namespace, key, result, created_at) VALUES (?, ?, ?, ?)",
                (ns, idem, _result_json(result), now),
            )
        return result

    def _insert_memory(
        self,
        conn: sqlite3.Connection,
        write: Write,
        supersedes: str | None,
        scores: str,
        now: float,
    ) -> tuple[str, int]:
        fact = write.fact
        memory_id = write.memory_id or new_memory_id()
        if conn.execute("SELECT 1 FROM memories WHERE id = ?", (memory_id,)).fetchone():
            raise Conflict(f"memory id {memory_id} is already taken")
        cur = conn.execute(
            "INSERT INTO memories (id, namespace, kind, text, key, inferred_key, metadata, "
            "source, created_at, status, supersedes, superseded_by, scores, embedding) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, NULL, ?, ?)",
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
        )
        return memory_id, cast(int, cur.lastrowid)

    @staticmethod
    def _active_rowid(conn: sqlite3.Connection, namespace: str, memory_id: str) -> int:
        row = conn.execute(
            "SELECT rowid, status FROM memories WHERE id = ? AND namespace = ?",
            (memory_id, namespace),
        ).fetchone()
        if row is None or row[1] != "active":
            raise Conflict(f"memory {memory_id} is not active in this namespace")
        return int(row[0])

    @staticmethod
    def _event(
        conn: sqlite3.Connection,
        namespace: str,
        type_: str,
        memory_id: str | None,
        target_id: str | None,
        policy: str | None,
        scores: str,
        now: float,
    ) -> None:
        conn.execute(
            "INSERT INTO events (namespace, type, memory_id, target_id, policy, scores, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (namespace, type_, memory_id, target_id, policy, scores, now),
        )

    def forget(self, namespace: str, memory_id: str) -> int:
        """Erase a memory: status ``forgotten``, text ``""``, embedding and text-derived scores
        dropped, here and in the review item that produced it. Returns its rowid (drop it from
        the index). Forgetting a forgotten memory changes nothing and returns the same rowid.

        Erasure is the one rewrite of the event log: the ``hypothesis`` (normalised text) is
        removed from the memory's events; everything else of them stays.
        """
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("forget") as conn:
            row = conn.execute(
                "SELECT rowid, status, scores FROM memories WHERE id = ? AND namespace = ?",
                (memory_id, namespace),
            ).fetchone()
            if row is None:
                raise NotFound(f"no memory {memory_id} in this namespace")
            rowid = int(row[0])
            if row[1] == "forgotten":
                return rowid
            conn.execute(
                "UPDATE memories SET status = 'forgotten', text = '', embedding = NULL, "
                "scores = ? WHERE rowid = ?",
                (_dumps(_scrub(_loads_dict(row[2])), "scores"), rowid),
            )
            events = conn.execute(
                "SELECT seq, scores FROM events WHERE memory_id = ? AND namespace = ?",
                (memory_id, namespace),
            ).fetchall()
            for seq, scores in events:
                conn.execute(
                    "UPDATE events SET scores = ? WHERE seq = ?",
                    (_dumps(_scrub(_loads_dict(scores)), "scores"), seq),
                )
            reviews = conn.execute(
                "SELECT id, fact FROM reviews WHERE resolved_memory_id = ? AND namespace = ?",
                (memory_id, namespace),
            ).fetchall()
            for review_id, fact in reviews:
                erased = {**json.loads(fact), "text": ""}
                conn.execute(
                    "UPDATE reviews SET fact = ?, embedding = NULL WHERE id = ?",
                    (_dumps(erased, "fact"), review_id),
                )
            self._event(conn, namespace, "forget", memory_id, None, None, "{}", now)
            return rowid

    def undo(self, namespace: str, memory_id: str) -> UndoResult:
        """Undo the replacement ``memory_id`` made: it becomes ``undone`` and the memory it
        superseded is active again.

        ``NotFound`` if absent or foreign; ``Conflict`` if it is not active, replaced nothing,
        or the replaced memory is no longer superseded by it (e.g. it was forgotten).
        """
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("undo") as conn:
            row = conn.execute(
                "SELECT rowid, status, supersedes FROM memories WHERE id = ? AND namespace = ?",
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
                "WHERE id = ? AND namespace = ?",
                (old_id, namespace),
            ).fetchone()
            if old is None or old[1] != "superseded" or old[2] != memory_id:
                raise Conflict(f"the memory {memory_id} replaced is no longer superseded by it")
            restored_rowid = int(old[0])
            conn.execute("UPDATE memories SET status = 'undone' WHERE rowid = ?", (undone_rowid,))
            conn.execute(
                "UPDATE memories SET status = 'active', superseded_by = NULL WHERE rowid = ?",
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
        """Resolve a pending review item, in one transaction.

        ``accept``: the fact replaces the item's target (``Conflict`` if the target is no longer
        active; a plain add when the item had no target). ``keep_both``: the fact is added next
        to the target. ``reject``: nothing is stored. ``memory_id`` names the new memory.
        """
        _check_namespace(namespace)
        if resolution not in RESOLUTIONS:
            raise InvalidInput(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
        now = self._clock()
        with self._transaction("resolve_review") as conn:
            row = conn.execute(
                "SELECT fact, inferred_key, policy, embedding, target_id, scores, status "
                "FROM reviews WHERE id = ? AND namespace = ?",
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
                        "UPDATE memories SET status = 'superseded', superseded_by = ? "
                        "WHERE rowid = ?",
                        (new_id, superseded_rowid),
                    )
            conn.execute(
                "UPDATE reviews SET status = ?, resolved_at = ?, resolved_memory_id = ? "
                "WHERE id = ?",
                (_RESOLVED_STATUS[resolution], now, new_id, review_id),
            )
            event_scores = _dumps({"review_id": review_id, "resolution": resolution}, "scores")
            self._event(
                conn, namespace, "review_resolved", new_id, target_id, policy, event_scores, now
            )
            item = _review(
                conn.execute(
                    f"SELECT {_REVIEW_COLUMNS} FROM reviews WHERE id = ?", (review_id,)
                ).fetchone()
            )
        return ReviewResolution(
            review=item,
            memory_id=new_id,
            rowid=rowid,
            superseded_rowid=superseded_rowid,
            embedding=embedding if new_id is not None else None,
        )

    # -- reads -----------------------------------------------------------------------------

    @staticmethod
    def _memory_by_rowid(conn: sqlite3.Connection, rowid: int) -> Memory:
        row = conn.execute(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE rowid = ?", (rowid,)
        ).fetchone()
        return _memory(row)

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        """The memory, or None when absent or stored under another namespace."""
        _check_namespace(namespace)
        with self._reading("get") as conn:
            row = conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = ? AND namespace = ?",
                (memory_id, namespace),
            ).fetchone()
        return None if row is None else _memory(row)

    def get_many(self, namespace: str, ids: Sequence[str]) -> list[Memory]:
        """The memories found, in the order of ``ids``; absent or foreign ids are left out."""
        _check_namespace(namespace)
        found: dict[str, Memory] = {}
        unique = list(dict.fromkeys(ids))
        with self._reading("get_many") as conn:
            for row in _rows_in(
                conn,
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = ? AND id",
                namespace,
                unique,
            ):
                found[row[0]] = _memory(row)
        return [found[i] for i in ids if i in found]

    def texts_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, ActiveText]:
        """Id, text and keys of the *active* memories of ``namespace`` among ``rowids``.

        Rowids that are no longer active (superseded since the index was searched), of another
        namespace, or negative (FAISS padding) are left out.
        """
        _check_namespace(namespace)
        out: dict[int, ActiveText] = {}
        with self._reading("texts_for_rowids") as conn:
            for rowid, id_, text, inferred_key, key, kind in _rows_in(
                conn,
                "SELECT rowid, id, text, inferred_key, key, kind FROM memories "
                "WHERE namespace = ? AND status = 'active' AND rowid",
                namespace,
                _wanted(rowids),
            ):
                out[int(rowid)] = ActiveText(id_, text, inferred_key, key, kind)
        return out

    def active_by_key(self, namespace: str, key: str) -> Memory | None:
        """The newest active memory of ``namespace`` with the explicit ``key``."""
        _check_namespace(namespace)
        with self._reading("active_by_key") as conn:
            row = conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories "
                "WHERE namespace = ? AND key = ? AND status = 'active' "
                "ORDER BY rowid DESC LIMIT 1",
                (namespace, key),
            ).fetchone()
        return None if row is None else _memory(row)

    def iter_active_embeddings(self, namespace: str) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories, by rowid.

        With no active memory the vectors have shape ``(0, 0)``: the store does not know the
        index's dimension. ``StorageError`` if stored embeddings disagree on their dimension.
        """
        _check_namespace(namespace)
        with self._reading("iter_active_embeddings") as conn:
            rows = conn.execute(
                "SELECT rowid, embedding FROM memories "
                "WHERE namespace = ? AND status = 'active' AND embedding IS NOT NULL "
                "ORDER BY rowid",
                (namespace,),
            ).fetchall()
        return _stack(namespace, rows)

    def namespaces(self) -> list[str]:
        """Every namespace that holds a memory (of any status), sorted."""
        with self._reading("namespaces") as conn:
            rows = conn.execute("SELECT DISTINCT namespace FROM memories ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def count_active(self, namespace: str) -> int:
        _check_namespace(namespace)
        with self._reading("count_active") as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM memories WHERE namespace = ? AND status = 'active'",
                (namespace,),
            ).fetchone()
        return int(row[0])

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first.

        Walks back to the chain's first memory, then forward through every memory that
        supersedes one of the chain (undone branches included). ``NotFound`` if absent.
        """
        _check_namespace(namespace)
        with self._reading("history") as conn:
            root = conn.execute(
                """
                WITH RECURSIVE up(id, supersedes, depth) AS (
                    SELECT id, supersedes, 0 FROM memories WHERE id = ? AND namespace = ?
                    UNION
                    SELECT m.id, m.supersedes, up.depth + 1
                    FROM memories m JOIN up ON m.id = up.supersedes
                    WHERE m.namespace = ? AND up.depth < 1000000
                )
                SELECT id FROM up ORDER BY depth DESC LIMIT 1
                """,
                (memory_id, namespace, namespace),
            ).fetchone()
            if root is None:
                raise NotFound(f"no memory {memory_id} in this namespace")
            rows = conn.execute(
                f"""
                WITH RECURSIVE down(id) AS (
                    SELECT ?
                    UNION
                    SELECT m.id FROM memories m JOIN down ON m.supersedes = down.id
                    WHERE m.namespace = ?
                )
                SELECT {_MEMORY_COLUMNS} FROM memories
                WHERE namespace = ? AND id IN (SELECT id FROM down)
                ORDER BY rowid
                """,
                (root[0], namespace, namespace),
            ).fetchall()
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
                "FROM events WHERE namespace = ? AND seq > ? ORDER BY seq LIMIT ?",
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
                "WHERE namespace = ? AND status = ? ORDER BY created_at, rowid LIMIT ?",
                (namespace, status, limit),
            ).fetchall()
        return [_review(r) for r in rows]

    def idempotent_results(self, namespace: str, keys: Sequence[str]) -> dict[str, WriteResult]:
        """The recorded result of every key of ``keys`` already committed in ``namespace``:
        the gate answers those facts as replays before deciding anything else."""
        _check_namespace(namespace)
        unique = sorted(set(keys))
        out: dict[str, WriteResult] = {}
        with self._reading("idempotent_results") as conn:
            for key, result in _rows_in(
                conn,
                "SELECT key, result FROM idempotency WHERE namespace = ? AND key",
                namespace,
                unique,
            ):
                out[key] = _result(result)
        return out

    # -- index snapshots (engine.index.snapshot.SnapshotSource) ----------------------------

    def namespace_seq(self, namespace: str) -> int:
        """The namespace's newest event ``seq``; 0 when it has none.

        Every change of the active set writes an event in its transaction (commit, forget,
        undo, resolve_review), so an index snapshot taken at ``seq`` is stale exactly when
        this has grown. Event seqs are never reused (AUTOINCREMENT).
        """
        _check_namespace(namespace)
        with self._reading("namespace_seq") as conn:
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE namespace = ?", (namespace,)
            ).fetchone()
        return int(row[0])

    def changes_since(self, namespace: str, after_seq: int) -> tuple[int, np.ndarray]:
        """``(seq, rowids)``: the namespace's newest event seq, and the sorted rowids of every
        memory an event after ``after_seq`` added, replaced, restored or removed."""
        _check_namespace(namespace)
        with self._reading("changes_since") as conn:
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE namespace = ?", (namespace,)
            ).fetchone()
            seq = int(row[0])
            if seq <= after_seq:
                return seq, np.empty(0, dtype=np.int64)
            rows = conn.execute(
                "SELECT m.rowid FROM events e JOIN memories m ON m.id = e.memory_id "
                "WHERE e.namespace = ?1 AND e.seq > ?2 AND e.seq <= ?3 "
                "UNION SELECT m.rowid FROM events e JOIN memories m ON m.id = e.target_id "
                "WHERE e.namespace = ?1 AND e.seq > ?2 AND e.seq <= ?3 ORDER BY 1",
                (namespace, after_seq, seq),
            ).fetchall()
        return seq, np.fromiter((r for (r,) in rows), dtype=np.int64, count=len(rows))

    def active_rowids(self, namespace: str) -> np.ndarray:
        """int64 rowids of the namespace's active memories with an embedding, sorted: the
        set ``iter_active_embeddings`` returns, without reading the vectors."""
        _check_namespace(namespace)
        with self._reading("active_rowids") as conn:
            rows = conn.execute(
                "SELECT rowid FROM memories "
                "WHERE namespace = ? AND status = 'active' AND embedding IS NOT NULL "
                "ORDER BY rowid",
                (namespace,),
            ).fetchall()
        return np.fromiter((r for (r,) in rows), dtype=np.int64, count=len(rows))

    def active_embeddings(
        self, namespace: str, rowids: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories of
        ``namespace`` among ``rowids``, by rowid (others left out). ``StorageError`` if their
        embeddings disagree on their dimension."""
        _check_namespace(namespace)
        with self._reading("active_embeddings") as conn:
            # Chunks of sorted rowids, each ordered: the rows come out by rowid.
            found = list(
                _rows_in(
                    conn,
                    "SELECT rowid, embedding FROM memories WHERE namespace = ? "
                    "AND status = 'active' AND embedding IS NOT NULL AND rowid",
                    namespace,
                    _wanted(rowids),
                    " ORDER BY rowid",
                )
            )
        return _stack(namespace, found)


def _rows_in(
    conn: sqlite3.Connection,
    head: str,
    namespace: str,
    values: Sequence[Any],
    tail: str = "",
) -> Iterator[Any]:
    """The rows of ``{head} IN (values){tail}`` (``namespace`` is the first parameter), run in
    chunks of ``_CHUNK`` values to stay under SQLite's parameter limit."""
    for start in range(0, len(values), _CHUNK):
        chunk = values[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        yield from conn.execute(f"{head} IN ({marks}){tail}", (namespace, *chunk))
