"""The store contract: what the gate needs from the source of truth.

The store holds every memory ever written (active, superseded, forgotten, undone), the
append-only event log, the review queue and the idempotency table. A FAISS index is only a
cache of the *active* memories' embeddings, keyed by the store's int64 ``rowid``; this module
defines the values that let the index follow each change (``rowid``, ``superseded_rowid``,
``restored_embedding``...).

Pure: no I/O here. ``SQLiteStore`` (``engine.store.sqlite``) and ``PostgresStore``
(``engine.store.postgres``, shared by several replicas) implement :class:`Store`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np

from engine.errors import InvalidInput
from engine.lifecycle import AsOf, LogEvent
from engine.types import ACTIONS, KINDS, Action, Event, Fact, Memory, ReviewItem

__all__ = [
    "RESOLUTIONS",
    "REVIEW_STATUSES",
    "ActiveText",
    "Embedded",
    "Expired",
    "Resolution",
    "ReviewResolution",
    "ReviewStatus",
    "Store",
    "StoreSettings",
    "UndoResult",
    "Write",
    "WriteResult",
    "new_memory_id",
    "new_review_id",
]

Resolution = Literal["accept", "keep_both", "reject"]
RESOLUTIONS: tuple[str, ...] = ("accept", "keep_both", "reject")
ReviewStatus = Literal["pending", "accepted", "kept_both", "rejected"]
REVIEW_STATUSES: tuple[str, ...] = ("pending", "accepted", "kept_both", "rejected")

_MAX_ID_CHARS = 128


def new_memory_id() -> str:
    """A fresh opaque memory id: ``mem_`` and 24 random hex characters.

    The gate assigns ids before it commits, so a later write of the same batch can replace a
    memory an earlier write of that batch adds.
    """
    return "mem_" + secrets.token_hex(12)


def new_review_id() -> str:
    """A fresh opaque review-queue id: ``rev_`` and 24 random hex characters."""
    return "rev_" + secrets.token_hex(12)


@dataclass(frozen=True)
class StoreSettings:
    """How a store opens its database. Every field has a safe default."""

    busy_timeout_ms: int = 5000
    """How long a write waits for another connection's lock before failing, in ms."""
    wal_autocheckpoint: int = 1000
    """WAL pages after which SQLite checkpoints into the main file (0 disables it)."""
    max_batch: int = 10_000
    """Most writes one ``commit`` call may carry (one transaction)."""
    max_db_bytes: int | None = None
    """Cap on the database file size; writes beyond it fail with ``StorageFull``. None: no cap."""
    max_as_of_events: int = 100_000
    """Most events an as-of read may walk back over (the namespace's events after the point
    it asks for): an older point is refused with ``InvalidInput``. Bounds the cost of as-of
    reads to this many event rows plus the memories they touched."""
    lock_timeout_s: float = 5.0
    """How long a write waits for a namespace's lock held by another writer (another replica's
    PostgreSQL transaction) before it fails with ``NamespaceBusy`` (UNAVAILABLE, retryable,
    naming the namespace). A few seconds: a caller retries elsewhere or later instead of
    spending its deadline, and the wait holds up only that namespace (``--lock-timeout``).
    SQLite's own wait on its file lock is ``busy_timeout_ms``."""
    lock_hold_s: float = 15.0
    """Longest a transaction holding namespace locks may sit idle between two statements
    (PostgreSQL's ``idle_in_transaction_session_timeout``): a replica frozen or cut off while
    it holds a namespace loses the lock after this long. A live holder renews its lease (a
    heartbeat statement every ``min(5, lock_hold_s / 3)`` s), so its model work between the
    decision and the commit may take longer (``--lock-hold-timeout``)."""

    def __post_init__(self) -> None:
        if not 0.01 <= self.lock_timeout_s <= 3600:
            raise InvalidInput(f"lock_timeout_s must be in [0.01, 3600], got {self.lock_timeout_s}")
        if not 1.0 <= self.lock_hold_s <= 86400:
            raise InvalidInput(f"lock_hold_s must be in [1, 86400], got {self.lock_hold_s}")
        if not 0 <= self.busy_timeout_ms <= 600_000:
            raise InvalidInput(
                f"busy_timeout_ms must be in [0, 600000], got {self.busy_timeout_ms}"
            )
        if not 0 <= self.wal_autocheckpoint <= 1_000_000:
            raise InvalidInput(
                f"wal_autocheckpoint must be in [0, 1000000], got {self.wal_autocheckpoint}"
            )
        if not 1 <= self.max_batch <= 1_000_000:
            raise InvalidInput(f"max_batch must be in [1, 1000000], got {self.max_batch}")
        if self.max_db_bytes is not None and not 1 << 16 <= self.max_db_bytes <= 1 << 50:
            raise InvalidInput(f"max_db_bytes must be in [65536, 2**50], got {self.max_db_bytes}")
        if not 1 <= self.max_as_of_events <= 100_000_000:
            raise InvalidInput(f"max_as_of_events must be in [1, 1e8], got {self.max_as_of_events}")


def _check_id(value: str | None, what: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID_CHARS:
        raise InvalidInput(f"{what} must be a non-empty string of at most {_MAX_ID_CHARS} chars")


@dataclass(frozen=True, eq=False)
class Write:
    """One decision of the gate, ready to be made durable.

    ``add``: store ``fact`` as a new active memory. ``replace``: store it and mark ``target_id``
    superseded by it. ``skip``: store nothing (log only). ``review``: queue it for a human,
    against ``target_id``.
    """

    action: Action
    fact: Fact
    target_id: str | None = None
    """The memory replaced (replace), duplicated (skip) or contested (review)."""
    embedding: np.ndarray | None = None
    """float32 1-D embedding of the fact; required for add, replace and review."""
    scores: dict[str, Any] = field(default_factory=dict)
    """The decision's score record (``Decision.scores()``), stored with the memory and event."""
    policy: str = ""
    inferred_key: str | None = None
    memory_id: str | None = None
    """Id for the new memory (from :func:`new_memory_id`); None lets the store generate one."""
    default_ttl_s: float | None = None
    """The policy's TTL for the fact's kind, used when the fact carries no ``expires_at`` nor
    ``ttl_s`` (engine.lifecycle.expiry_time)."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise InvalidInput(f"action must be one of {ACTIONS}, got {self.action!r}")
        fact = self.fact
        if not isinstance(fact.namespace, str) or not fact.namespace:
            raise InvalidInput("namespace must be a non-empty string")
        if not isinstance(fact.text, str):
            raise InvalidInput("text must be a string")
        if fact.kind not in KINDS:
            raise InvalidInput(f"kind must be one of {KINDS}, got {fact.kind!r}")
        if not isinstance(fact.metadata, dict):
            raise InvalidInput("metadata must be a dict")
        if not isinstance(self.scores, dict):
            raise InvalidInput("scores must be a dict")
        _check_id(self.target_id, "target_id")
        _check_id(self.memory_id, "memory_id")
        _check_id(fact.idempotency_key, "idempotency_key")
        if self.action == "replace" and self.target_id is None:
            raise InvalidInput("a replace needs a target_id")
        if self.action in ("add", "replace", "review"):
            if self.embedding is None:
                raise InvalidInput(f"an {self.action} needs an embedding")
            vec = np.asarray(self.embedding)
            if vec.ndim != 1 or vec.size == 0:
                raise InvalidInput(f"embedding must be 1-D and non-empty, got shape {vec.shape}")
            if not np.issubdtype(vec.dtype, np.floating):
                raise InvalidInput(f"embedding must be floating point, got {vec.dtype}")
            vec = np.ascontiguousarray(vec, dtype=np.float32)
            if not np.isfinite(vec).all():
                raise InvalidInput("embedding holds NaN or infinity")
            object.__setattr__(self, "embedding", vec)


@dataclass(frozen=True)
class WriteResult:
    """What one :class:`Write` did. ``rowid`` keys the new memory in the index."""

    action: Action
    memory_id: str | None = None
    """The memory stored (add, replace); None for skip and review."""
    target_id: str | None = None
    review_id: str | None = None
    rowid: int | None = None
    """Index key of the new memory: add it to the namespace's index."""
    superseded_rowid: int | None = None
    """Index key of the memory this write superseded: remove it from the index."""
    replayed: bool = False
    """True when an idempotency key matched: this is the first write's result, nothing changed."""


class Expired(NamedTuple):
    """A memory the expiry sweep marked ``expired`` (its ``expire`` event is written)."""

    namespace: str
    memory_id: str
    rowid: int


class Embedded(NamedTuple):
    """A stored memory with its embedding (any status)."""

    rowid: int
    memory: Memory
    embedding: np.ndarray


class ActiveText(NamedTuple):
    """What the gate needs about an active memory after an index search."""

    id: str
    text: str
    inferred_key: str | None
    key: str | None
    kind: str = "semantic"
    """Episodic memories are recalled but never candidates for replacement."""


@dataclass(frozen=True, eq=False)
class UndoResult:
    """An undone replacement: ``undone`` is out of the index, ``restored`` is back in it."""

    restored: Memory
    undone: Memory
    restored_rowid: int
    undone_rowid: int
    restored_embedding: np.ndarray | None
    """float32 1-D; None only if the restored memory was stored without one."""


@dataclass(frozen=True, eq=False)
class ReviewResolution:
    """A resolved review item and what the index has to do about it."""

    review: ReviewItem
    """The item, with its new status and ``resolved_memory_id``."""
    memory_id: str | None
    """The memory stored by accept / keep_both; None for reject."""
    rowid: int | None
    """Index key of the stored memory: add it."""
    superseded_rowid: int | None
    """Index key of the memory an accept superseded: remove it."""
    embedding: np.ndarray | None
    """The stored memory's embedding (float32 1-D); None for reject."""


@runtime_checkable
class Store(Protocol):
    """The source of truth. Every method is thread-safe; ids of another namespace read as absent.

    Errors: ``InvalidInput`` for bad arguments, ``NotFound`` for absent or foreign ids,
    ``Conflict`` when an operation does not apply to the current state, ``StorageError`` /
    ``StorageFull`` when the backend cannot persist (the caller should stop writing).
    """

    def commit(self, writes: Sequence[Write]) -> list[WriteResult]:
        """Apply all writes in one transaction, in order; on any error nothing is written."""
        ...

    def get(self, namespace: str, memory_id: str) -> Memory | None: ...

    def get_many(self, namespace: str, ids: Sequence[str]) -> list[Memory]:
        """The memories found, in the order of ``ids``; absent or foreign ids are left out."""
        ...

    def texts_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, ActiveText]:
        """Id, text and keys of the *active* memories among ``rowids`` (hot path after search)."""
        ...

    def active_by_key(self, namespace: str, key: str) -> Memory | None:
        """The newest active memory with this explicit key."""
        ...

    def iter_active_embeddings(self, namespace: str) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the namespace's active memories."""
        ...

    def namespaces(self) -> list[str]: ...

    def count_active(self, namespace: str) -> int: ...

    def forget(self, namespace: str, memory_id: str) -> int:
        """Erase a memory (text and embedding); returns its rowid so the index can drop it."""
        ...

    def undo(self, namespace: str, memory_id: str) -> UndoResult:
        """Undo an active replacement: it becomes ``undone``, what it replaced is active again."""
        ...

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """Every memory of the supersedes chain holding ``memory_id``, oldest first."""
        ...

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]: ...

    def list_review(
        self, namespace: str, status: ReviewStatus = "pending", limit: int = 100
    ) -> list[ReviewItem]: ...

    def resolve_review(
        self,
        namespace: str,
        review_id: str,
        resolution: Resolution,
        memory_id: str | None = None,
    ) -> ReviewResolution: ...

    def integrity_check(self) -> bool: ...

    def close(self) -> None: ...

    def idempotent_results(self, namespace: str, keys: Sequence[str]) -> dict[str, WriteResult]:
        """The recorded result of each of ``keys`` already committed in ``namespace``."""
        ...

    # What the index needs to verify and reconcile its snapshots (engine.index.snapshot).

    def namespace_seq(self, namespace: str) -> int:
        """The namespace's newest event sequence number; 0 when it has none. Every change of
        the active set writes an event, so this grows with each one."""
        ...

    def active_rowids(self, namespace: str) -> np.ndarray:
        """int64 rowids of the namespace's active memories with an embedding, sorted."""
        ...

    def active_embeddings(
        self, namespace: str, rowids: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories among
        ``rowids``, by rowid."""
        ...

    def changes_since(self, namespace: str, after_seq: int) -> tuple[int, np.ndarray]:
        """``(seq, rowids)``: the namespace's newest event seq, and the sorted rowids of the
        memories the events after ``after_seq`` touched. A replica's index at ``after_seq``
        is current again once it holds exactly the active ones of them (``active_embeddings``).
        """
        ...

    # Expiry and as-of reads (engine.lifecycle holds the rule they share).

    def now(self) -> float:
        """The store's clock: the time lazy expiry is judged by."""
        ...

    def due_namespaces(self, limit: int) -> list[str]:
        """The namespaces of the (up to ``limit``) memories the next sweep step would expire."""
        ...

    def expire_due(self, limit: int, namespaces: Iterable[str] | None = None) -> list[Expired]:
        """Mark up to ``limit`` active memories past their ``expires_at`` as ``expired`` (of
        ``namespaces`` only, when given), with an ``expire`` event each, in one transaction
        (oldest expiry first)."""
        ...

    def as_of_point(self, namespace: str, as_of: AsOf) -> tuple[int, float]:
        """``(seq, time)`` of a point of the namespace's log: for a time, the newest event
        stamped at or before it; for a seq, the time of the newest event up to it."""
        ...

    def touched_since(self, namespace: str, seq: int) -> list[str]:
        """Ids of the memories the namespace's events after ``seq`` named (stored, replaced,
        restored, forgotten, expired); ``InvalidInput`` beyond ``max_as_of_events`` events."""
        ...

    def lifecycle_events(self, namespace: str, ids: Sequence[str]) -> dict[str, list[LogEvent]]:
        """Every event naming each of ``ids`` (as memory or target), oldest first."""
        ...

    def memories_for_rowids(self, namespace: str, rowids: Sequence[int]) -> dict[int, Memory]:
        """The memories among ``rowids`` of any status, with lazy expiry applied."""
        ...

    def embedded(self, namespace: str, ids: Sequence[str]) -> list[Embedded]:
        """The memories among ``ids`` that keep an embedding, of any status."""
        ...

    def inactive_embedded(self, namespace: str, limit: int) -> tuple[list[Embedded], bool]:
        """Up to ``limit`` inactive memories with an embedding, newest first, and whether
        more were left out."""
        ...

    def lock_namespaces(self, namespaces: Iterable[str]) -> AbstractContextManager[None]:
        """Hold the namespaces' write lock across processes from a decision to its commit;
        the next write of them on this thread commits inside it. A no-op where one process
        owns the store (SQLite)."""
        ...
