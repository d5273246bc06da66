"""The store's queries and the logic around them, written once for every SQL backend.

:class:`SQLStore` holds the bodies of the :class:`~engine.store.base.Store` methods: argument
checks, the statements, row decoding, idempotency, the event log, history, undo, forget and the
review queue. A backend (``engine.store.sqlite``, ``engine.store.postgres``) adds what really
differs: how it opens and closes connections, its locking, how it translates driver errors, and
a :class:`Dialect` naming the few statements its SQL writes differently.

Statements are written with ``?`` placeholders; a :class:`Session` sends them in the dialect's
style. Pure of drivers: nothing here imports ``sqlite3`` or ``psycopg``, each backend passes
its connections in.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from types import TracebackType
from typing import Any, ClassVar, Self, cast

import numpy as np

from engine.errors import Conflict, InvalidInput, NotFound
from engine.lifecycle import AsOf, LogEvent, expiry_time, status_now
from engine.store._codec import (
    _MEMORY_COLUMNS,
    _RESOLVED_STATUS,
    _REVIEW_COLUMNS,
    _blob,
    _check_limit,
    _check_namespace,
    _dumps,
    _event,
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
    Embedded,
    Expired,
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

__all__ = ["Dialect", "SQLStore", "Session"]

_PLACEHOLDERS = ("?", "%s")
_MAX_IN = 32_765  # SQLite's default limit of bound parameters (32766), less the namespace


@dataclass(frozen=True)
class Dialect:
    """What one backend's SQL writes differently. Pure data, checked on construction."""

    name: str
    """The backend's name (``sqlite``, ``postgres``)."""
    placeholder: str
    """How the driver marks a parameter: ``?`` (sqlite3) or ``%s`` (psycopg)."""
    event_sql: str
    """Appends one event; ``?`` parameters: namespace, type, memory_id, target_id, policy,
    scores, created_at. It also assigns the event's ``seq`` (how is the backend's affair)."""
    seq_sql: str
    """The namespace's newest event seq (one ``?``: the namespace): one row, or none for 0."""
    namespaces_sql: str
    """Every namespace holding a memory, distinct, sorted by code point."""
    review_order: str
    """The reviews column that breaks ties of ``created_at`` in insertion order."""
    max_in: int | None
    """Most values one ``IN (...)`` list may carry; None: the driver binds a whole list as
    one array parameter (``= ANY(?)``)."""
    returning: bool
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING`` and ``UPDATE ... RETURNING`` are used
    (one round trip). False: the store checks, then writes, then reads back."""
    skip_empty: bool
    """An empty request (no writes, no ids) is answered without touching the database. False:
    every call checks the store's state first (a failed SQLite store refuses even those)."""

    def __post_init__(self) -> None:
        if self.placeholder not in _PLACEHOLDERS:
            raise InvalidInput(
                f"placeholder must be one of {_PLACEHOLDERS}, got {self.placeholder!r}"
            )
        if self.max_in is not None and not 1 <= self.max_in <= _MAX_IN:
            raise InvalidInput(f"max_in must be in [1, {_MAX_IN}] or None, got {self.max_in}")
        for what in ("event_sql", "seq_sql", "namespaces_sql", "review_order"):
            if not getattr(self, what).strip():
                raise InvalidInput(f"{what} must not be empty")

    def sql(self, statement: str) -> str:
        """``statement`` (``?`` placeholders) in this driver's placeholder style."""
        if self.placeholder == "?":
            return statement
        return _restyle(statement, self.placeholder)


@functools.lru_cache(maxsize=1024)
def _restyle(statement: str, placeholder: str) -> str:
    # The store's statements hold no ``?`` or ``%`` in literals, so a plain replace is exact.
    return statement.replace("?", placeholder)


class Session:
    """One connection's statements, written with ``?`` and sent in the dialect's style.

    ``conn`` is the driver's connection (anything whose ``execute(sql, params)`` returns a
    cursor); the backend owns its transaction."""

    __slots__ = ("conn", "dialect")

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Execute one statement; returns the driver's cursor."""
        return self.conn.execute(self.dialect.sql(sql), params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of the statement, or None."""
        return self.run(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of the statement."""
        return cast(list[Any], self.run(sql, params).fetchall())

    def rows_in(
        self, head: str, namespace: str, values: Sequence[Any], tail: str = ""
    ) -> Iterator[Any]:
        """The rows of ``{head} IN (values){tail}`` (``namespace`` is the first parameter):
        one array parameter where the driver binds lists, else chunks of ``max_in`` values
        (SQLite's parameter limit). Sorted ``values`` and an ordered ``tail`` give ordered
        rows either way."""
        size = self.dialect.max_in
        if size is None:
            yield from self.run(f"{head} = ANY(?){tail}", (namespace, list(values)))
            return
        for start in range(0, len(values), size):
            chunk = values[start : start + size]
            marks = ",".join("?" * len(chunk))
            yield from self.run(f"{head} IN ({marks}){tail}", (namespace, *chunk))


_INSERT_MEMORY = (
    "INSERT INTO memories (id, namespace, kind, text, key, inferred_key, metadata, "
    "source, created_at, status, supersedes, superseded_by, scores, embedding, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, NULL, ?, ?, ?)"
)
_INSERT_REVIEW = (
    "INSERT INTO reviews (id, namespace, fact, inferred_key, policy, embedding, "
    "target_id, scores, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)"
)
_RESOLVE_REVIEW = (
    "UPDATE reviews SET status = ?, resolved_at = ?, resolved_memory_id = ? WHERE id = ?"
)
_HISTORY = f"""
    WITH RECURSIVE up(id, supersedes, depth) AS (
        SELECT id, supersedes, 0 FROM memories WHERE id = ? AND namespace = ?
        UNION
        SELECT m.id, m.supersedes, up.depth + 1
        FROM memories m JOIN up ON m.id = up.supersedes
        WHERE m.namespace = ? AND up.depth < 1000000
    ),
    root AS (SELECT id FROM up ORDER BY depth DESC LIMIT 1),
    down(id) AS (
        SELECT id FROM root
        UNION
        SELECT m.id FROM memories m JOIN down ON m.supersedes = down.id
        WHERE m.namespace = ?
    )
    SELECT {_MEMORY_COLUMNS} FROM memories
    WHERE namespace = ? AND id IN (SELECT id FROM down)
    ORDER BY rowid
"""
# The rowids an event range touched, through its memory and its target.
_CHANGED = (
    "SELECT m.rowid FROM events e JOIN memories m ON m.id = e.memory_id "
    "WHERE e.namespace = ? AND e.seq > ? AND e.seq <= ? "
    "UNION SELECT m.rowid FROM events e JOIN memories m ON m.id = e.target_id "
    "WHERE e.namespace = ? AND e.seq > ? AND e.seq <= ? ORDER BY 1"
)
# Lazy expiry: an active memory past its expires_at reads as expired (engine.lifecycle).
_LIVE = "status = 'active' AND (expires_at IS NULL OR expires_at > ?)"
_ACTIVE_WITH_EMBEDDING = (
    "FROM memories WHERE namespace = ? AND status = 'active' AND embedding IS NOT NULL"
)


def _lazy(memory: Memory, now: float) -> Memory:
    """``memory`` as a read at ``now`` reports it: expired once past its ``expires_at``."""
    if status_now(memory.status, memory.expires_at, now) == memory.status:
        return memory
    return dc_replace(memory, status="expired", inactive_since=memory.expires_at)


def _rowids(rows: Sequence[Any]) -> np.ndarray:
    return np.fromiter((r for (r,) in rows), dtype=np.int64, count=len(rows))


class SQLStore(ABC):
    """The :class:`~engine.store.base.Store` methods over a backend's sessions.

    A backend sets ``dialect`` and ``_settings`` / ``_clock``, and provides ``_reading``
    (one consistent read), ``_transaction`` (one write transaction holding the namespaces'
    locks; rolled back on any error, driver errors translated), ``close``,
    ``integrity_check`` and ``lock_namespaces``.
    """

    dialect: ClassVar[Dialect]
    _settings: StoreSettings
    _clock: Callable[[], float]

    @abstractmethod
    def _reading(self, what: str) -> AbstractContextManager[Session]: ...

    @abstractmethod
    def _transaction(
        self, what: str, namespaces: Iterable[str]
    ) -> AbstractContextManager[Session]: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
        if not writes and self.dialect.skip_empty:
            return []
        now = self._clock()
        with self._transaction("commit", {w.fact.namespace for w in writes}) as db:
            return [self._apply(db, write, now) for write in writes]

    def _apply(self, db: Session, write: Write, now: float) -> WriteResult:
        fact = write.fact
        ns = fact.namespace
        idem = fact.idempotency_key
        if idem is not None:
            row = db.one(
                "SELECT result FROM idempotency WHERE namespace = ? AND key = ?", (ns, idem)
            )
            if row is not None:
                return _result(row[0])
        scores = _dumps(write.scores, "scores")
        if write.action == "add":
            memory_id, rowid = self._insert_memory(db, write, None, scores, now)
            result = WriteResult("add", memory_id=memory_id, rowid=rowid)
            self._log(db, ns, "add", memory_id, None, write.policy, scores, now)
        elif write.action == "replace":
            target = cast(str, write.target_id)
            target_rowid = self._active_rowid(db, ns, target)
            memory_id, rowid = self._insert_memory(db, write, target, scores, now)
            self._supersede(db, target_rowid, memory_id, now)
            result = WriteResult(
                "replace",
                memory_id=memory_id,
                target_id=target,
                rowid=rowid,
                superseded_rowid=target_rowid,
            )
            self._log(db, ns, "replace", memory_id, target, write.policy, scores, now)
        elif write.action == "skip":
            result = WriteResult("skip", target_id=write.target_id)
            self._log(db, ns, "skip", None, write.target_id, write.policy, scores, now)
        else:
            review_id = new_review_id()
            if write.default_ttl_s is not None and fact.expires_at is None and fact.ttl_s is None:
                fact = dc_replace(fact, ttl_s=write.default_ttl_s)  # counted from the accept
            review = (review_id, ns, _fact_json(fact), write.inferred_key, write.policy)
            db.run(_INSERT_REVIEW, (*review, _blob(write.embedding), write.target_id, scores, now))
            result = WriteResult("review", target_id=write.target_id, review_id=review_id)
            event_scores = _dumps({**write.scores, "review_id": review_id}, "scores")
            self._log(
                db, ns, "review_queued", None, write.target_id, write.policy, event_scores, now
            )
        if idem is not None:
            db.run(
                "INSERT INTO idempotency (namespace, key, result, created_at) VALUES (?, ?, ?, ?)",
                (ns, idem, _result_json(result), now),
            )
        return result

    def _insert_memory(
        self, db: Session, write: Write, supersedes: str | None, scores: str, now: float
    ) -> tuple[str, int]:
        fact = write.fact
        memory_id = write.memory_id or new_memory_id()
        expires_at = expiry_time(now, fact.expires_at, fact.ttl_s, write.default_ttl_s)
        params = (
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
            expires_at,
        )
        rowid: int | None = None
        if self.dialect.returning:
            row = db.one(f"{_INSERT_MEMORY} ON CONFLICT (id) DO NOTHING RETURNING rowid", params)
            rowid = None if row is None else int(row[0])
        elif not db.one("SELECT 1 FROM memories WHERE id = ?", (memory_id,)):
            rowid = int(db.run(_INSERT_MEMORY, params).lastrowid)
        if rowid is None:
            raise Conflict(f"memory id {memory_id} is already taken")
        return memory_id, rowid

    @staticmethod
    def _active_rowid(db: Session, namespace: str, memory_id: str) -> int:
        row = db.one(
            "SELECT rowid, status FROM memories WHERE id = ? AND namespace = ?",
            (memory_id, namespace),
        )
        if row is None or row[1] != "active":
            raise Conflict(f"memory {memory_id} is not active in this namespace")
        return int(row[0])

    @staticmethod
    def _owned(db: Session, columns: str, namespace: str, memory_id: str) -> Any:
        """``columns`` of the memory ``memory_id`` of ``namespace``; ``NotFound`` if absent."""
        row = db.one(
            f"SELECT {columns} FROM memories WHERE id = ? AND namespace = ?",
            (memory_id, namespace),
        )
        if row is None:
            raise NotFound(f"no memory {memory_id} in this namespace")
        return row

    @staticmethod
    def _supersede(db: Session, rowid: int, by: str, now: float) -> None:
        db.run(
            "UPDATE memories SET status = 'superseded', superseded_by = ?, inactive_since = ? "
            "WHERE rowid = ?",
            (by, now, rowid),
        )

    @staticmethod
    def _log(
        db: Session,
        namespace: str,
        type_: str,
        memory_id: str | None,
        target_id: str | None,
        policy: str | None,
        scores: str,
        now: float,
    ) -> None:
        db.run(db.dialect.event_sql, (namespace, type_, memory_id, target_id, policy, scores, now))

    def forget(self, namespace: str, memory_id: str) -> int:
        """Erase a memory: status ``forgotten``, text ``""``, embedding and text-derived scores
        dropped, here and in the review item that produced it. Returns its rowid (drop it from
        the index). Forgetting a forgotten memory changes nothing and returns the same rowid.

        Erasure is the one rewrite of the event log: the ``hypothesis`` (normalised text) is
        removed from the memory's events; everything else of them stays.
        """
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("forget", {namespace}) as db:
            row = self._owned(db, "rowid, status, scores", namespace, memory_id)
            rowid = int(row[0])
            if row[1] == "forgotten":
                return rowid
            db.run(
                "UPDATE memories SET status = 'forgotten', text = '', embedding = NULL, "
                "scores = ?, inactive_since = COALESCE(inactive_since, ?) WHERE rowid = ?",
                (_dumps(_scrub(_loads_dict(row[2])), "scores"), now, rowid),
            )
            events = db.all(
                "SELECT seq, scores FROM events WHERE memory_id = ? AND namespace = ?",
                (memory_id, namespace),
            )
            for seq, scores in events:
                db.run(
                    "UPDATE events SET scores = ? WHERE namespace = ? AND seq = ?",
                    (_dumps(_scrub(_loads_dict(scores)), "scores"), namespace, seq),
                )
            reviews = db.all(
                "SELECT id, fact FROM reviews WHERE resolved_memory_id = ? AND namespace = ?",
                (memory_id, namespace),
            )
            for review_id, fact in reviews:
                erased = {**json.loads(fact), "text": ""}
                db.run(
                    "UPDATE reviews SET fact = ?, embedding = NULL WHERE id = ?",
                    (_dumps(erased, "fact"), review_id),
                )
            self._log(db, namespace, "forget", memory_id, None, None, "{}", now)
            return rowid

    def undo(self, namespace: str, memory_id: str) -> UndoResult:
        """Undo the replacement ``memory_id`` made: it becomes ``undone`` and the memory it
        superseded is active again.

        ``NotFound`` if absent or foreign; ``Conflict`` if it is not active, replaced nothing,
        or the replaced memory is no longer superseded by it (e.g. it was forgotten).
        """
        _check_namespace(namespace)
        now = self._clock()
        with self._transaction("undo", {namespace}) as db:
            row = self._owned(db, "rowid, status, supersedes", namespace, memory_id)
            undone_rowid, status, old_id = int(row[0]), row[1], row[2]
            if status != "active":
                raise Conflict(f"memory {memory_id} is {status}, not active")
            if old_id is None:
                raise Conflict(f"memory {memory_id} replaced nothing")
            old = db.one(
                "SELECT rowid, status, superseded_by, embedding FROM memories "
                "WHERE id = ? AND namespace = ?",
                (old_id, namespace),
            )
            if old is None or old[1] != "superseded" or old[2] != memory_id:
                raise Conflict(f"the memory {memory_id} replaced is no longer superseded by it")
            restored_rowid = int(old[0])
            db.run(
                "UPDATE memories SET status = 'undone', inactive_since = ? WHERE rowid = ?",
                (now, undone_rowid),
            )
            db.run(
                "UPDATE memories SET status = 'active', superseded_by = NULL, "
                "inactive_since = NULL WHERE rowid = ?",
                (restored_rowid,),
            )
            self._log(db, namespace, "undo", memory_id, old_id, None, "{}", now)
            restored = self._memory_by_rowid(db, restored_rowid)
            undone = self._memory_by_rowid(db, undone_rowid)
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
        with self._transaction("resolve_review", {namespace}) as db:
            row = db.one(
                "SELECT fact, inferred_key, policy, embedding, target_id, scores, status "
                "FROM reviews WHERE id = ? AND namespace = ?",
                (review_id, namespace),
            )
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
                    superseded_rowid = self._active_rowid(db, namespace, replaces)
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
                    db, write, replaces, _dumps(scores, "scores"), now
                )
                if superseded_rowid is not None:
                    self._supersede(db, superseded_rowid, new_id, now)
            resolved = (_RESOLVED_STATUS[resolution], now, new_id, review_id)
            if self.dialect.returning:
                item_row = db.one(f"{_RESOLVE_REVIEW} RETURNING {_REVIEW_COLUMNS}", resolved)
            else:
                db.run(_RESOLVE_REVIEW, resolved)
                item_row = db.one(
                    f"SELECT {_REVIEW_COLUMNS} FROM reviews WHERE id = ?", (review_id,)
                )
            event_scores = _dumps({"review_id": review_id, "resolution": resolution}, "scores")
            self._log(
                db, namespace, "review_resolved", new_id, target_id, policy, event_scores, now
            )
        return ReviewResolution(
            review=_review(item_row),
            memory_id=new_id,
            rowid=rowid,
            superseded_rowid=superseded_rowid,
            embedding=embedding if new_id is not None else None,
        )

    # -- reads -----------------------------------------------------------------------------

    def _memory_by_rowid(self, db: Session, rowid: int) -> Memory:
        row = db.one(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE rowid = ?", (rowid,))
        return _lazy(_memory(row), self._clock())

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        """The memory, or None when absent or stored under another namespace. An active
        memory past its ``expires_at`` reads as ``expired`` (lazy expiry)."""
        _check_namespace(namespace)
        now = self._clock()
        with self._reading("get") as db:
            row = db.one(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = ? AND namespace = ?",
                (memory_id, namespace),
            )
        return None if row is None else _lazy(_memory(row), now)

    def get_many(self, namespace: str, ids: Sequence[str]) -> list[Memory]:
        """The memories found, in the order of ``ids``; absent or foreign ids are left out."""
        _check_namespace(namespace)
        unique = list(dict.fromkeys(ids))
        now = self._clock()
        with self._reading("get_many") as db:
            found = {
                row[0]: _lazy(_memory(row), now)
                for row in db.rows_in(
                    f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = ? AND id",
                    namespace,
                    unique,
                )
            }
        return [found[i] for i in ids if i in found]

    def texts_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, ActiveText]:
        """Id, text and keys of the *active* memories of ``namespace`` among ``rowids``.

        Rowids that are no longer active (superseded since the index was searched), of another
        namespace, or negative (FAISS padding) are left out.
        """
        _check_namespace(namespace)
        wanted = _wanted(rowids)
        if not wanted and self.dialect.skip_empty:
            return {}
        now = self._clock()
        with self._reading("texts_for_rowids") as db:
            return {
                int(rowid): ActiveText(id_, text, inferred_key, key, kind)
                for rowid, id_, text, inferred_key, key, kind, expires_at in db.rows_in(
                    "SELECT rowid, id, text, inferred_key, key, kind, expires_at FROM memories "
                    "WHERE namespace = ? AND status = 'active' AND rowid",
                    namespace,
                    wanted,
                    " ORDER BY rowid",
                )
                if expires_at is None or expires_at > now  # never a candidate once expired
            }

    def active_by_key(self, namespace: str, key: str) -> Memory | None:
        """The newest active memory of ``namespace`` with the explicit ``key``."""
        _check_namespace(namespace)
        now = self._clock()
        with self._reading("active_by_key") as db:
            row = db.one(
                f"SELECT {_MEMORY_COLUMNS} FROM memories "
                f"WHERE namespace = ? AND key = ? AND {_LIVE} "
                "ORDER BY rowid DESC LIMIT 1",
                (namespace, key, now),
            )
        return None if row is None else _memory(row)

    def iter_active_embeddings(self, namespace: str) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories, by rowid.

        With no active memory the vectors have shape ``(0, 0)``: the store does not know the
        index's dimension. ``StorageError`` if stored embeddings disagree on their dimension.
        """
        _check_namespace(namespace)
        with self._reading("iter_active_embeddings") as db:
            rows = db.all(
                f"SELECT rowid, embedding {_ACTIVE_WITH_EMBEDDING} ORDER BY rowid", (namespace,)
            )
        return _stack(namespace, rows)

    def namespaces(self) -> list[str]:
        """Every namespace that holds a memory (of any status), sorted by code point."""
        with self._reading("namespaces") as db:
            rows = db.all(self.dialect.namespaces_sql)
        return [r[0] for r in rows]

    def count_active(self, namespace: str) -> int:
        _check_namespace(namespace)
        now = self._clock()
        with self._reading("count_active") as db:
            row = db.one(
                f"SELECT COUNT(*) FROM memories WHERE namespace = ? AND {_LIVE}",
                (namespace, now),
            )
        return int(row[0])

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first.

        Walks back to the chain's first memory, then forward through every memory that
        supersedes one of the chain (undone branches included), in one statement: one
        snapshot. ``NotFound`` if absent.
        """
        _check_namespace(namespace)
        now = self._clock()
        with self._reading("history") as db:
            rows = db.all(_HISTORY, (memory_id, namespace, namespace, namespace, namespace))
        if not rows:
            raise NotFound(f"no memory {memory_id} in this namespace")
        return [_lazy(_memory(r), now) for r in rows]

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """The namespace's events with ``seq > after_seq``, oldest first."""
        _check_namespace(namespace)
        _check_limit(limit)
        if after_seq < 0:
            raise InvalidInput(f"after_seq must be >= 0, got {after_seq}")
        with self._reading("events") as db:
            rows = db.all(
                "SELECT seq, namespace, type, memory_id, target_id, policy, scores, created_at "
                "FROM events WHERE namespace = ? AND seq > ? ORDER BY seq LIMIT ?",
                (namespace, after_seq, limit),
            )
        return [_event(r) for r in rows]

    def list_review(
        self, namespace: str, status: ReviewStatus = "pending", limit: int = 100
    ) -> list[ReviewItem]:
        """Review items of ``namespace`` with ``status``, oldest first."""
        _check_namespace(namespace)
        _check_limit(limit)
        if status not in REVIEW_STATUSES:
            raise InvalidInput(f"status must be one of {REVIEW_STATUSES}, got {status!r}")
        with self._reading("list_review") as db:
            rows = db.all(
                f"SELECT {_REVIEW_COLUMNS} FROM reviews WHERE namespace = ? AND status = ? "
                f"ORDER BY created_at, {self.dialect.review_order} LIMIT ?",
                (namespace, status, limit),
            )
        return [_review(r) for r in rows]

    def idempotent_results(self, namespace: str, keys: Sequence[str]) -> dict[str, WriteResult]:
        """The recorded result of every key of ``keys`` already committed in ``namespace``:
        the gate answers those facts as replays before deciding anything else."""
        _check_namespace(namespace)
        unique = sorted(set(keys))
        if not unique and self.dialect.skip_empty:
            return {}
        with self._reading("idempotent_results") as db:
            return {
                key: _result(result)
                for key, result in db.rows_in(
                    "SELECT key, result FROM idempotency WHERE namespace = ? AND key",
                    namespace,
                    unique,
                )
            }

    # -- index snapshots and replicas (engine.index) ---------------------------------------

    def namespace_seq(self, namespace: str) -> int:
        """The namespace's newest event ``seq``; 0 when it has none.

        Every change of the active set writes an event in its transaction (commit, forget,
        undo, resolve_review), so an index snapshot taken at ``seq`` is stale exactly when
        this has grown. Event seqs are never reused.
        """
        _check_namespace(namespace)
        with self._reading("namespace_seq") as db:
            return self._seq(db, namespace)

    def _seq(self, db: Session, namespace: str) -> int:
        row = db.one(self.dialect.seq_sql, (namespace,))
        return 0 if row is None else int(row[0])

    def changes_since(self, namespace: str, after_seq: int) -> tuple[int, np.ndarray]:
        """``(seq, rowids)``: the namespace's newest event seq, and the sorted rowids of every
        memory an event after ``after_seq`` added, replaced, restored or removed. An index
        at ``after_seq`` is current again once it holds exactly the active ones of these."""
        _check_namespace(namespace)
        with self._reading("changes_since") as db:
            seq = self._seq(db, namespace)
            if seq <= after_seq:
                return seq, np.empty(0, dtype=np.int64)
            rows = db.all(_CHANGED, (namespace, after_seq, seq) * 2)
        return seq, _rowids(rows)

    def active_rowids(self, namespace: str) -> np.ndarray:
        """int64 rowids of the namespace's active memories with an embedding, sorted: the
        set ``iter_active_embeddings`` returns, without reading the vectors."""
        _check_namespace(namespace)
        with self._reading("active_rowids") as db:
            rows = db.all(f"SELECT rowid {_ACTIVE_WITH_EMBEDDING} ORDER BY rowid", (namespace,))
        return _rowids(rows)

    def active_embeddings(
        self, namespace: str, rowids: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories of
        ``namespace`` among ``rowids``, by rowid (others left out). ``StorageError`` if their
        embeddings disagree on their dimension."""
        _check_namespace(namespace)
        wanted = _wanted(rowids)
        if not wanted and self.dialect.skip_empty:
            return _stack(namespace, [])
        with self._reading("active_embeddings") as db:
            found = list(
                db.rows_in(
                    f"SELECT rowid, embedding {_ACTIVE_WITH_EMBEDDING} AND rowid",
                    namespace,
                    wanted,
                    " ORDER BY rowid",
                )
            )
        return _stack(namespace, found)

    # -- expiry and as-of reads (engine.lifecycle) -------------------------------------------

    def now(self) -> float:
        """The store's clock (injected in tests): lazy expiry is judged by it."""
        return self._clock()

    def _due(self, limit: int) -> list[tuple[int, str]]:
        if not 1 <= limit <= self._settings.max_batch:
            raise InvalidInput(f"limit must be in [1, {self._settings.max_batch}], got {limit}")
        now = self._clock()
        with self._reading("expire_due") as db:
            rows = db.all(
                "SELECT rowid, namespace FROM memories WHERE status = 'active' "
                "AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, rowid "
                "LIMIT ?",
                (now, limit),
            )
        return [(int(r), ns) for r, ns in rows]

    def due_namespaces(self, limit: int) -> list[str]:
        """The namespaces of the (up to ``limit``) memories the next sweep step would expire,
        sorted: the gate takes their write locks first."""
        return sorted({ns for _, ns in self._due(limit)})

    def expire_due(self, limit: int, namespaces: Iterable[str] | None = None) -> list[Expired]:
        """Mark up to ``limit`` active memories past their ``expires_at`` as ``expired``, oldest
        expiry first, each with an ``expire`` event, in one transaction (one bounded batch:
        writers wait for at most this one transaction). ``namespaces``: only those (the ones
        whose locks the caller holds). Returns what it expired, so the index can drop their
        rowids."""
        due = self._due(limit)
        if namespaces is not None:
            allowed = set(namespaces)
            due = [(r, ns) for r, ns in due if ns in allowed]
        if not due:
            return []
        now = self._clock()
        out: list[Expired] = []
        with self._transaction("expire_due", {ns for _, ns in due}) as db:
            for rowid, namespace in due:
                # Re-read under the lock: a writer may have replaced or forgotten it since.
                row = db.one(
                    "SELECT id FROM memories WHERE rowid = ? AND status = 'active'", (rowid,)
                )
                if row is None:
                    continue
                db.run(
                    "UPDATE memories SET status = 'expired', inactive_since = expires_at "
                    "WHERE rowid = ?",
                    (rowid,),
                )
                self._log(db, namespace, "expire", row[0], None, None, "{}", now)
                out.append(Expired(namespace, row[0], int(rowid)))
        return out

    def as_of_point(self, namespace: str, as_of: AsOf) -> tuple[int, float]:
        """``(seq, time)`` of a point of the namespace's log. A time T: the newest event of the
        namespace stamped at or before T (0 before the first), read at T. A seq S: S itself,
        read at the time of the newest event of the namespace up to S (0.0 before the
        first)."""
        _check_namespace(namespace)
        if not isinstance(as_of, AsOf):
            raise InvalidInput("as_of must be an engine.lifecycle.AsOf")
        with self._reading("as_of_point") as db:
            if as_of.time is not None:
                row = db.one(
                    "SELECT MAX(seq) FROM events WHERE namespace = ? AND created_at <= ?",
                    (namespace, as_of.time),
                )
                seq = 0 if row is None or row[0] is None else int(row[0])
                return seq, float(as_of.time)
            assert as_of.seq is not None
            row = db.one(
                "SELECT created_at FROM events WHERE namespace = ? AND seq <= ? "
                "ORDER BY seq DESC LIMIT 1",
                (namespace, as_of.seq),
            )
        return as_of.seq, 0.0 if row is None else float(row[0])

    def touched_since(self, namespace: str, seq: int) -> list[str]:
        """Ids of the memories named by the namespace's events after ``seq``, in log order.

        A memory no event after ``seq`` names has the same status at ``seq`` as now (up to
        lazy expiry, which is by time). ``InvalidInput`` when more than ``max_as_of_events``
        events follow ``seq``: the bound on an as-of read's cost."""
        _check_namespace(namespace)
        cap = self._settings.max_as_of_events
        with self._reading("touched_since") as db:
            rows = db.all(
                "SELECT memory_id, target_id FROM events WHERE namespace = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (namespace, seq, cap + 1),
            )
        if len(rows) > cap:
            raise InvalidInput(
                f"as_of is more than {cap} events back in this namespace; the store's "
                "max_as_of_events bounds how far an as-of read may look back"
            )
        return list(dict.fromkeys(i for row in rows for i in row if i))

    def lifecycle_events(self, namespace: str, ids: Sequence[str]) -> dict[str, list[LogEvent]]:
        """Every event of the namespace naming each of ``ids`` (as its memory or its
        target), oldest first."""
        _check_namespace(namespace)
        unique = sorted(set(ids))
        out: dict[str, list[LogEvent]] = {i: [] for i in unique}
        if not unique:
            return out
        columns = "SELECT seq, type, memory_id, target_id, created_at, scores FROM events"
        seen: dict[int, LogEvent] = {}
        with self._reading("lifecycle_events") as db:
            for column in ("memory_id", "target_id"):
                for seq, type_, mem, target, created_at, scores in db.rows_in(
                    f"{columns} WHERE namespace = ? AND {column}", namespace, unique
                ):
                    accepted = (
                        type_ == "review_resolved"
                        and _loads_dict(scores).get("resolution") == "accept"
                    )
                    seen[int(seq)] = LogEvent(
                        int(seq), type_, mem, target, float(created_at), accepted
                    )
        for event in sorted(seen.values(), key=lambda e: e.seq):
            for name in {event.memory_id, event.target_id}:
                if name in out:
                    out[name].append(event)
        return out

    def memories_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, Memory]:
        """The memories of ``namespace`` among ``rowids``, of any status (lazy expiry
        applied); negative rowids (FAISS padding) and foreign ones are left out."""
        _check_namespace(namespace)
        wanted = _wanted(rowids)
        if not wanted:
            return {}
        now = self._clock()
        with self._reading("memories_for_rowids") as db:
            return {
                int(row[0]): _lazy(_memory(row[1:]), now)
                for row in db.rows_in(
                    f"SELECT rowid, {_MEMORY_COLUMNS} FROM memories WHERE namespace = ? AND rowid",
                    namespace,
                    wanted,
                )
            }

    def embedded(self, namespace: str, ids: Sequence[str]) -> list[Embedded]:
        """The memories of ``namespace`` among ``ids`` that keep an embedding (forgotten ones
        do not), of any status, by rowid."""
        _check_namespace(namespace)
        unique = sorted(set(ids))
        if not unique:
            return []
        now = self._clock()
        with self._reading("embedded") as db:
            rows = list(
                db.rows_in(
                    f"SELECT rowid, {_MEMORY_COLUMNS}, embedding FROM memories "
                    "WHERE namespace = ? AND embedding IS NOT NULL AND id",
                    namespace,
                    unique,
                )
            )
        return sorted((_embedded(row, now) for row in rows), key=lambda e: e.rowid)

    def inactive_embedded(self, namespace: str, limit: int) -> tuple[list[Embedded], bool]:
        """Up to ``limit`` memories of ``namespace`` stored inactive (superseded, undone,
        expired by the sweep) that keep an embedding, newest first, and whether more were
        left out. Active memories past their expiry are the index's (lazy expiry)."""
        _check_namespace(namespace)
        if limit <= 0:
            return [], False
        now = self._clock()
        with self._reading("inactive_embedded") as db:
            rows = db.all(
                f"SELECT rowid, {_MEMORY_COLUMNS}, embedding FROM memories "
                "WHERE namespace = ? AND status <> 'active' AND embedding IS NOT NULL "
                "ORDER BY rowid DESC LIMIT ?",
                (namespace, limit + 1),
            )
        return [_embedded(row, now) for row in rows[:limit]], len(rows) > limit


def _embedded(row: Sequence[Any], now: float) -> Embedded:
    """``rowid, {_MEMORY_COLUMNS}, embedding`` -> :class:`Embedded`."""
    vec = _vector(row[-1])
    assert vec is not None
    return Embedded(int(row[0]), _lazy(_memory(row[1:-1]), now), vec)
