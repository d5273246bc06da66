"""Per-namespace indexes, loaded lazily from the store and evicted under a memory budget.

The store is the source of truth; an index is a cache of a namespace's *active* embeddings.
``loader(namespace)`` (``Store.iter_active_embeddings``) rebuilds one on first use. Writes
follow the store: after a commit, ``add`` / ``remove`` the rowids it reports. A namespace that
is not loaded ignores them, since its next load reads the committed store.

Snapshots (optional: ``snapshot_dir`` and a ``source``, see ``engine.index.snapshot``): a
namespace of at least ``IndexSettings.snapshot_min_vectors`` vectors is written to disk after a
build, when it is evicted and on :meth:`IndexManager.close`. A load reads the snapshot first,
verifies it, and reconciles it with the store's active rowids (stale ones removed, missing ones
added from the store), so what is served always equals the store. A snapshot that fails any
check is quarantined and the namespace is built from the store. :meth:`IndexManager.recover`
does this for every snapshot on disk; the server runs it before it reports SERVING.

Locking: a manager lock guards the table of namespaces, the LRU order and the pin counts;
each namespace has its own lock, held while its index is loaded, searched or changed, so
namespaces never wait on each other. A pinned namespace (one a call is using) is never
evicted. A snapshot is serialised under its namespace's lock and written to disk after every
lock is released, one file at a time. Snapshots nobody asked for (after a build, on
eviction) are written by a background thread, so no call waits for them; ``flush`` waits.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import numpy as np

from engine.errors import InvalidInput, MemgateError, ModelError
from engine.index.namespace import IndexKind, NamespaceIndex, set_threads
from engine.index.settings import IndexSettings
from engine.index.snapshot import (
    CorruptSnapshot,
    SnapshotHeader,
    SnapshotSource,
    clean_temporary,
    decode,
    encode,
    fsync_dir,
    namespace_digest,
    quarantine,
    read_snapshot,
    snapshot_path,
    write_atomic,
)

__all__ = ["Follow", "IndexManager", "IndexStats", "Loader", "NamespaceStats", "RecoveryReport"]

log = logging.getLogger("memgate.index")

# Rowids compared between a loaded snapshot and the store's embeddings: catches a snapshot of
# another database (same namespace, same rowids, other vectors).
_SAMPLE = 8
_CHUNK = 10_000
_ATOL = 1e-4

Loader = Callable[[str], tuple[np.ndarray, np.ndarray]]
"""``namespace -> (rowids int64 [n], vectors float32 [n, d])`` of its active memories."""


@dataclass(frozen=True)
class NamespaceStats:
    namespace: str
    kind: IndexKind
    ntotal: int
    nbytes: int
    nlist: int
    needs_rebuild: bool


@dataclass(frozen=True)
class IndexStats:
    namespaces: tuple[NamespaceStats, ...]
    """Loaded namespaces, least recently used first."""
    total_bytes: int
    budget_bytes: int
    loads: int
    """Namespace builds from the loader since start (lazy loads and rebuilds)."""
    evictions: int
    snapshot_loads: int = 0
    """Namespaces loaded from a verified snapshot (reconciled with the store)."""
    snapshots_reconciled: int = 0
    """Of those, how many the store had moved past (rowids removed or added on load)."""
    snapshots_rejected: int = 0
    """Snapshots that failed verification and were quarantined."""
    snapshots_written: int = 0
    caught_up: int = 0
    """Catch-ups that applied another process's events to a loaded index (followed stores)."""


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`IndexManager.recover` found in the snapshot directory."""

    files: int = 0
    """Snapshot files found."""
    loaded: int = 0
    """Verified, reconciled with the store and loaded."""
    reconciled: int = 0
    """Of the loaded, how many the store had moved past (patched on load)."""
    rejected: tuple[tuple[str, str], ...] = ()
    """``(file name, reason)`` of each snapshot quarantined (its namespace is rebuilt)."""
    rebuilt: int = 0
    """Namespaces built from the store at recovery (their snapshot was rejected or too stale)."""
    deferred: int = 0
    """Sound-looking snapshots left on disk because the memory budget was full: they are
    verified and reconciled when their namespace is first used."""
    temporary_removed: int = 0
    """Temporary files of interrupted snapshot writes that were removed."""
    namespaces: tuple[str, ...] = field(default=(), repr=False)
    """The namespaces loaded or rebuilt (not logged: names can be tenant data)."""


_EMPTY: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.float32), np.empty(0, np.int64))


class _Outcome:
    """What one load did; filled in by ``_obtain``."""

    __slots__ = ("built", "decoded", "reconciled", "rejected", "snapshot")

    def __init__(self) -> None:
        self.decoded: tuple[SnapshotHeader, memoryview] | None = None
        """The verified header and payload, when the caller has decoded the file already
        (recovery)."""
        self.built = False
        self.snapshot = False
        self.reconciled = False
        self.rejected: list[tuple[str, str]] = []


class _Entry:
    __slots__ = ("accounted", "index", "lock", "pins", "seq")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index: NamespaceIndex | None = None
        self.pins = 0
        self.accounted = 0
        """The index's bytes as last counted into the manager's total."""
        self.seq = 0
        """The store's event seq the index is known to reflect (followed stores only)."""


class Follow(Protocol):
    """A store other processes write too (PostgreSQL): what catching up on its log needs."""

    def namespace_seq(self, namespace: str) -> int: ...

    def changes_since(self, namespace: str, after_seq: int) -> tuple[int, np.ndarray]: ...

    def active_embeddings(
        self, namespace: str, rowids: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


class IndexManager:
    """All namespace indexes of one engine. Thread-safe.

    ``snapshot_dir`` and ``source`` (the store: ``namespace_seq``, ``active_rowids``,
    ``active_embeddings``) go together and turn snapshots on; without them every load is a
    build from ``loader``.

    ``follow`` (a store other processes write too, e.g. PostgreSQL shared by replicas): before
    each search a loaded namespace catches up on the store's events after the seq its index
    reflects (``changes_since``): the memories they touched are added if active, removed if
    not. So a replica never decides or recalls on a cache older than the store was when the
    search began; the gate's cross-replica lock makes that the newest state for a write.
    """

    def __init__(
        self,
        loader: Loader,
        settings: IndexSettings = IndexSettings(),  # noqa: B008 - frozen
        *,
        snapshot_dir: str | Path | None = None,
        source: SnapshotSource | None = None,
        follow: Follow | None = None,
    ) -> None:
        if (snapshot_dir is None) != (source is None):
            raise InvalidInput("snapshot_dir and source go together")
        self._loader = loader
        self._settings = settings
        self._dir = None if snapshot_dir is None else Path(snapshot_dir)
        self._source = source
        self._follow = follow
        self._caught_up = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # Snapshots written in the background: evicted indexes (their object, nobody else
        # holds it) and namespaces just built (None: snapshot the loaded index).
        self._jobs: deque[tuple[str, NamespaceIndex | None]] = deque()
        self._jobs_cond = threading.Condition()
        self._jobs_open = 0
        self._writer: threading.Thread | None = None
        self._total = 0
        self._loads = 0
        self._evictions = 0
        self._snapshot_loads = 0
        self._reconciled = 0
        self._rejected = 0
        self._written = 0
        set_threads(settings.threads)

    @property
    def snapshot_dir(self) -> Path | None:
        return self._dir

    @property
    def settings(self) -> IndexSettings:
        return self._settings

    # -- pinning and loading ---------------------------------------------------------------

    @contextmanager
    def _use(
        self, namespace: str, load: bool, outcome: _Outcome | None = None
    ) -> Iterator[_Entry | None]:
        """Pin the namespace and hold its lock; load its index first when ``load``.

        Yields None when the namespace has no entry and ``load`` is False. ``entry.index`` is
        only ever assigned with both the entry lock and the manager lock held, so ``_shrink``
        and ``stats`` (manager lock only) read it safely. Snapshots of what was evicted, and
        of a namespace just built, are left to the background writer.
        """
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInput("namespace must be a non-empty string")
        with self._lock:
            entry = self._entries.get(namespace)
            if entry is None and load:
                entry = self._entries[namespace] = _Entry()
            if entry is not None:
                self._entries.move_to_end(namespace)
                entry.pins += 1
        if entry is None:
            yield None
            return
        outcome = outcome or _Outcome()
        try:
            with entry.lock:
                follow = self._follow if load else None
                if entry.index is None and load:
                    # The seq is read before the load: the index holds at least that state.
                    entry.seq = 0 if follow is None else follow.namespace_seq(namespace)
                    self._install(namespace, entry, self._obtain(namespace, outcome))
                elif follow is not None and entry.index is not None:
                    self._catch_up(namespace, entry, follow)
                yield entry
        finally:
            with self._lock:
                entry.pins -= 1
                self._account(entry)
                if entry.index is None and not entry.pins:
                    # Evicted, or its load failed: drop the husk (unpinned, so never locked).
                    if self._entries.get(namespace) is entry:
                        del self._entries[namespace]
                self._shrink(keep=namespace)
        if outcome.built and self._dir is not None:
            self._later(namespace, None)

    def _install(self, namespace: str, entry: _Entry, index: NamespaceIndex | None) -> None:
        """Set a pinned, locked entry's index (None: evict it) and re-apply the budget."""
        with self._lock:
            if index is None and entry.index is not None:
                self._evictions += 1
                if self._dir is not None:
                    self._later(namespace, entry.index)
            entry.index = index
            self._account(entry)
            self._shrink(keep=namespace)

    def _catch_up(self, namespace: str, entry: _Entry, follow: Follow) -> None:
        """Apply the store's events after ``entry.seq`` to the loaded index (entry locked).

        Events of one namespace commit in seq order (the store's namespace lock), so nothing
        before ``seq`` can appear later. Re-applying this process's own writes is harmless:
        ``add`` skips present rowids and ``remove`` absent ones."""
        index = entry.index
        assert index is not None
        seq, touched = follow.changes_since(namespace, entry.seq)
        if seq <= entry.seq:
            return
        touched = np.asarray(touched, dtype=np.int64)
        if len(touched):
            rows, vecs = follow.active_embeddings(namespace, touched)
            rows = np.asarray(rows, dtype=np.int64)
            index.remove(np.setdiff1d(touched, rows))
            if len(rows):
                index.add(rows, np.asarray(vecs, dtype=np.float32))
        entry.seq = seq
        with self._lock:
            self._caught_up += 1

    def _account(self, entry: _Entry) -> None:
        """Refresh the entry's share of the total (manager lock held)."""
        now = 0 if entry.index is None else entry.index.nbytes
        self._total += now - entry.accounted
        entry.accounted = now

    def _build(self, namespace: str) -> NamespaceIndex:
        rowids, vecs = self._loader(namespace)
        rowids = np.asarray(rowids)
        vecs = np.asarray(vecs)
        if len(rowids) == 0:
            vecs = np.empty((0, self._settings.dim), dtype=np.float32)
        elif vecs.ndim != 2 or vecs.shape[1] != self._settings.dim:
            raise ModelError(
                f"namespace {namespace!r} holds embeddings of shape {vecs.shape[1:]}, "
                f"the index expects dimension {self._settings.dim}"
            )
        index = NamespaceIndex.build(rowids, vecs, self._settings)
        with self._lock:
            self._loads += 1
        return index

    def _obtain(self, namespace: str, outcome: _Outcome) -> NamespaceIndex:
        """The namespace's index: from its snapshot when one verifies, else built."""
        if self._dir is not None:
            index = self._from_snapshot(namespace, outcome)
            if index is not None:
                outcome.snapshot = True
                return index
        outcome.built = True
        return self._build(namespace)

    # -- snapshots: loading ----------------------------------------------------------------

    def _reject(self, path: Path, reason: str, outcome: _Outcome) -> None:
        quarantine(path)
        with self._lock:
            self._rejected += 1
        outcome.rejected.append((path.name, reason))
        # The file name (a digest), never the namespace: names can be tenant data.
        log.warning(
            "index snapshot rejected; rebuilding from the store",
            extra={"fields": {"file": path.name, "reason": reason}},
        )

    def _from_snapshot(self, namespace: str, outcome: _Outcome) -> NamespaceIndex | None:
        """The verified, reconciled snapshot of ``namespace``; None: build it instead."""
        assert self._dir is not None
        path = snapshot_path(self._dir, namespace)
        decoded, outcome.decoded = outcome.decoded, None
        if decoded is None:
            try:
                data = read_snapshot(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                self._reject(path, f"unreadable ({exc.strerror})", outcome)
                return None
        try:
            header, payload = decoded or decode(data, namespace=namespace, dim=self._settings.dim)
            kind = cast(IndexKind, header.kind)  # decode checked it
            index = NamespaceIndex.from_bytes(
                payload, self._settings, kind, header.count, header.built_n
            )
        except CorruptSnapshot as exc:
            self._reject(path, str(exc), outcome)
            return None
        except Exception as exc:  # noqa: BLE001 - a bad file must never take the server down
            self._reject(path, f"payload rejected: {type(exc).__name__}: {exc}"[:300], outcome)
            return None
        del decoded, payload
        return self._reconcile(namespace, path, header, index, outcome)

    def _reconcile(
        self,
        namespace: str,
        path: Path,
        header: SnapshotHeader,
        index: NamespaceIndex,
        outcome: _Outcome,
    ) -> NamespaceIndex | None:
        """Bring a verified snapshot to the store's active set, or None (rebuild).

        A rowid's embedding never changes while it is active (rowids are never reused), so
        the set difference is all there is to apply; a sample of vectors is still compared
        with the store, which catches a snapshot of another database.
        """
        source = self._source
        assert source is not None
        if header.seq > source.namespace_seq(namespace):
            self._reject(path, "snapshot is ahead of the store", outcome)
            return None
        active = np.asarray(source.active_rowids(namespace), dtype=np.int64)
        have = index.rowids()
        common = np.intersect1d(have, active, assume_unique=True)
        if len(common):
            pick = np.unique(common[np.linspace(0, len(common) - 1, _SAMPLE).astype(np.int64)])
            rows, vecs = source.active_embeddings(namespace, pick)
            if not _same_vectors(index, rows, vecs):
                self._reject(path, "vectors differ from the store's", outcome)
                return None
        stale = np.setdiff1d(have, active, assume_unique=True)
        missing = np.setdiff1d(active, have, assume_unique=True)
        changes = len(stale) + len(missing)
        if changes > self._settings.reconcile_max_fraction * max(len(active), 1):
            # Cheaper to build than to patch; the file is stale, not corrupt.
            self._discard(namespace)
            return None
        index.remove(stale)
        for start in range(0, len(missing), _CHUNK):
            rows, vecs = source.active_embeddings(namespace, missing[start : start + _CHUNK])
            rows, vecs = np.asarray(rows), np.asarray(vecs)
            if len(rows) and (vecs.ndim != 2 or vecs.shape[1] != self._settings.dim):
                raise ModelError(
                    f"namespace {namespace!r} holds embeddings of shape {vecs.shape[1:]}, "
                    f"the index expects dimension {self._settings.dim}"
                )
            if len(rows):
                index.add(rows, vecs)
        if not changes:
            index.saved_generation = index.generation  # the file holds exactly this
        outcome.reconciled = changes > 0
        with self._lock:
            self._snapshot_loads += 1
            self._reconciled += changes > 0
        return index

    def recover(self) -> RecoveryReport:
        """Check every snapshot on disk before serving.

        Removes temporary files of interrupted writes; quarantines files that fail
        verification (wrong name for their namespace included) and builds those namespaces
        from the store; loads and reconciles the rest, most recent first, while the memory
        budget allows (the others stay on disk, verified again on first use). Never raises for
        a bad file; a store error (``StorageError``) propagates.
        """
        if self._dir is None:
            return RecoveryReport()
        removed = clean_temporary(self._dir)
        try:
            files = [p for p in self._dir.iterdir() if p.suffix == ".idx" and p.is_file()]
        except FileNotFoundError:
            return RecoveryReport(temporary_removed=removed)
        files.sort(key=_mtime, reverse=True)
        dim = self._settings.dim
        per_vector = 4 * dim + 128
        loaded = reconciled = rebuilt = deferred = 0
        rejected: list[tuple[str, str]] = []
        names: list[str] = []
        owners: dict[str, str] | None = None
        for path in files:
            outcome = _Outcome()
            namespace: str | None = None
            count = 0
            try:
                header, payload = decode(read_snapshot(path), namespace=None, dim=dim)
                if namespace_digest(header.namespace) != path.stem:
                    raise CorruptSnapshot("snapshot of another namespace")
                namespace, count = header.namespace, header.count
                outcome.decoded = header, payload
            except (CorruptSnapshot, OSError) as exc:
                reason = str(exc) if isinstance(exc, CorruptSnapshot) else "unreadable"
                self._reject(path, reason, outcome)
                # The header can't be trusted to name the namespace: the store can.
                if owners is None:
                    assert self._source is not None
                    owners = {namespace_digest(ns): ns for ns in self._source.namespaces()}
                namespace = owners.get(path.stem)
                if namespace is None:
                    rejected.extend(outcome.rejected)
                    continue  # nothing stored under it: nothing to rebuild
            with self._lock:
                entry = self._entries.get(namespace)
                if entry is not None and entry.index is not None:
                    rejected.extend(outcome.rejected)
                    continue  # already loaded: that index follows the store
                full = self._total + count * per_vector > self._settings.memory_budget_bytes
            if full:
                deferred += not outcome.rejected
                rejected.extend(outcome.rejected)
                continue
            with self._use(namespace, load=True, outcome=outcome):
                pass
            rejected.extend(outcome.rejected)
            names.append(namespace)
            loaded += outcome.snapshot
            reconciled += outcome.reconciled
            rebuilt += outcome.built
        report = RecoveryReport(
            files=len(files),
            loaded=loaded,
            reconciled=reconciled,
            rejected=tuple(rejected),
            rebuilt=rebuilt,
            deferred=deferred,
            temporary_removed=removed,
            namespaces=tuple(names),
        )
        log.info(
            "index snapshots recovered",
            extra={
                "fields": {
                    "files": report.files,
                    "loaded": loaded,
                    "reconciled": reconciled,
                    "rejected": len(rejected),
                    "rebuilt": rebuilt,
                    "deferred": deferred,
                    "temporary_removed": removed,
                }
            },
        )
        return report

    # -- snapshots: writing ----------------------------------------------------------------

    def _prepare(self, namespace: str, index: NamespaceIndex) -> tuple[int, bytes] | None:
        """``(generation, file bytes)`` of a snapshot of ``index``, or None when there is
        nothing to write (or the store could not say its sequence: logged). The caller holds
        the index exclusively (its namespace lock, or it was evicted)."""
        source = self._source
        assert source is not None
        if index.saved_generation == index.generation:
            return None
        # The sequence is read before the index is serialised: the snapshot holds at least
        # that state, so its seq never runs ahead of the store.
        try:
            seq = source.namespace_seq(namespace)
        except MemgateError as exc:
            log.warning("index snapshot skipped", extra={"fields": {"error": str(exc)}})
            return None
        generation = index.generation
        header = SnapshotHeader(
            namespace=namespace,
            seq=seq,
            count=index.ntotal,
            dim=index.dim,
            kind=index.kind,
            built_n=index.built_n,
        )
        return generation, encode(header, index.to_bytes())

    def _write(self, namespace: str, index: NamespaceIndex, generation: int, data: bytes) -> bool:
        assert self._dir is not None
        path = snapshot_path(self._dir, namespace)
        with self._write_lock:
            if index.saved_generation >= generation:
                return False  # a newer snapshot of this index is already on disk
            try:
                write_atomic(path, data)
            except OSError as exc:
                log.warning(
                    "could not write an index snapshot",
                    extra={"fields": {"file": path.name, "error": exc.strerror}},
                )
                return False
            index.saved_generation = generation
        with self._lock:
            self._written += 1
        return True

    def _discard(self, namespace: str) -> None:
        """Remove a namespace's snapshot (too small to keep, or too stale to patch)."""
        assert self._dir is not None
        path = snapshot_path(self._dir, namespace)
        with self._write_lock:
            try:
                path.unlink()
            except OSError:  # FileNotFoundError included: nothing to remove
                return
            fsync_dir(self._dir)

    def _save(self, namespace: str, index: NamespaceIndex) -> bool:
        """Snapshot an index nobody else holds (an evicted one). Never raises."""
        small = index.ntotal < self._settings.snapshot_min_vectors
        return self._finish(namespace, index, None if small else self._prepare(namespace, index))

    def _finish(
        self, namespace: str, index: NamespaceIndex, prepared: tuple[int, bytes] | None
    ) -> bool:
        """Write what ``_prepare`` made, or remove the snapshot of a namespace too small to
        keep; called with no lock held."""
        if index.ntotal < self._settings.snapshot_min_vectors:
            self._discard(namespace)
            return False
        return prepared is not None and self._write(namespace, index, *prepared)

    def _later(self, namespace: str, index: NamespaceIndex | None) -> None:
        """Queue a snapshot for the background writer (started on demand, ends when idle), so
        no caller waits for a file write it did not ask for."""
        with self._jobs_cond:
            self._jobs.append((namespace, index))
            self._jobs_open += 1
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._drain, name="memgate-index-snapshots", daemon=True
                )
                self._writer.start()

    def _drain(self) -> None:
        while True:
            with self._jobs_cond:
                if not self._jobs:
                    self._writer = None
                    return
                namespace, index = self._jobs.popleft()
            try:
                if index is None:
                    self.snapshot(namespace)
                else:
                    self._save(namespace, index)
            except Exception as exc:  # noqa: BLE001 - a cache write must not kill the writer
                log.warning(
                    "index snapshot failed",
                    extra={"fields": {"error": f"{type(exc).__name__}: {exc}"[:300]}},
                )
            finally:
                with self._jobs_cond:
                    self._jobs_open -= 1
                    self._jobs_cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the background snapshot writes queued so far; False on timeout."""
        with self._jobs_cond:
            return self._jobs_cond.wait_for(lambda: self._jobs_open == 0, timeout)

    def snapshot(self, namespace: str) -> bool:
        """Write a loaded namespace's snapshot now (if it changed since the last one and holds
        at least ``snapshot_min_vectors``). Serialised under the namespace's lock, written
        after it is released. True when a file was written. Never raises for I/O errors."""
        if self._dir is None:
            return False
        with self._use(namespace, load=False) as entry:
            if entry is None or entry.index is None:
                return False
            index = entry.index
            small = index.ntotal < self._settings.snapshot_min_vectors
            prepared = None if small else self._prepare(namespace, index)
        return self._finish(namespace, index, prepared)

    def snapshot_all(self) -> int:
        """Snapshot every loaded namespace (see :meth:`snapshot`) and wait for the background
        writes; returns the files this call wrote."""
        written = sum(self.snapshot(ns) for ns in self.loaded())
        self.flush()
        return written

    def close(self) -> int:
        """Write the snapshots of every loaded namespace and of those still queued (graceful
        shutdown). The manager stays usable; returns the files written for loaded ones."""
        self.flush()
        return self.snapshot_all()

    def _shrink(self, keep: str) -> None:
        """Evict least recently used, unpinned namespaces until the budget holds.

        Called with the manager lock held. ``keep`` (the namespace just used) stays, even alone
        over budget: evicting it would only reload it on the next call.
        """
        if self._total <= self._settings.memory_budget_bytes:
            return
        for namespace in list(self._entries):
            if self._total <= self._settings.memory_budget_bytes:
                break
            entry = self._entries[namespace]
            if entry.pins or namespace == keep:
                continue
            if entry.index is not None:
                if self._dir is not None:
                    self._later(namespace, entry.index)
                entry.index = None
                self._evictions += 1
            self._account(entry)
            del self._entries[namespace]

    # -- the API ---------------------------------------------------------------------------

    def search(self, namespace: str, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of ``namespace`` for each query of ``vecs`` [m, dim], loading it if needed.

        Returns ``(scores float32 [m, k], rowids int64 [m, k])``, best first, padded with
        rowid -1 and score ``-inf``.
        """
        with self._use(namespace, load=True) as entry:
            assert entry is not None and entry.index is not None
            return entry.index.search(vecs, k)

    def search_many(
        self, queries: Sequence[tuple[str, np.ndarray]], k: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Search one vector [dim] per ``(namespace, vector)``, one FAISS call per namespace.

        Returns ``(scores float32 [k], rowids int64 [k])`` per query, in the queries' order.
        """
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (namespace, vec) in enumerate(queries):
            if np.ndim(vec) != 1:
                raise InvalidInput(f"query {i} must be a 1-D vector, got shape {np.shape(vec)}")
            groups[namespace].append(i)
        out: list[tuple[np.ndarray, np.ndarray]] = [_EMPTY] * len(queries)
        for namespace, positions in groups.items():
            stacked = np.stack([np.asarray(queries[i][1]) for i in positions])
            scores, rowids = self.search(namespace, stacked, k)
            for row, i in enumerate(positions):
                out[i] = (scores[row], rowids[row])
        return out

    def add(self, namespace: str, rowids: Sequence[int] | np.ndarray, vecs: np.ndarray) -> int:
        """Add committed vectors to a loaded namespace; returns how many were added.

        0 when the namespace is not loaded (its next load reads them from the store) and for
        rowids already present.
        """
        with self._use(namespace, load=False) as entry:
            if entry is None or entry.index is None:
                return 0
            return entry.index.add(rowids, vecs)

    def remove(self, namespace: str, rowids: Sequence[int] | np.ndarray) -> int:
        """Remove rowids from a loaded namespace; returns how many were removed."""
        with self._use(namespace, load=False) as entry:
            if entry is None or entry.index is None:
                return 0
            return entry.index.remove(rowids)

    def rebuild(self, namespace: str) -> NamespaceStats:
        """Rebuild a namespace from the loader now (e.g. when it ``needs_rebuild``)."""
        with self._use(namespace, load=False) as entry:
            if entry is not None:
                if self._follow is not None:
                    entry.seq = self._follow.namespace_seq(namespace)
                index = self._build(namespace)
                self._install(namespace, entry, index)
                stats = _stats(namespace, index)
        if entry is not None:
            if self._dir is not None:
                self._later(namespace, None)
            return stats
        with self._use(namespace, load=True) as entry:
            assert entry is not None and entry.index is not None
            return _stats(namespace, entry.index)

    def evict(self, namespace: str) -> bool:
        """Drop a namespace's index (it reloads lazily). False when it was not loaded."""
        with self._use(namespace, load=False) as entry:
            if entry is None or entry.index is None:
                return False
            self._install(namespace, entry, None)
            return True

    def rowids(self, namespace: str) -> np.ndarray:
        """The rowids the namespace's index holds, sorted (loading it if needed)."""
        with self._use(namespace, load=True) as entry:
            assert entry is not None and entry.index is not None
            return entry.index.rowids()

    def loaded(self) -> list[str]:
        """Loaded namespaces, least recently used first."""
        with self._lock:
            return [ns for ns, e in self._entries.items() if e.index is not None]

    def stats(self) -> IndexStats:
        with self._lock:
            loaded = [(ns, e.index) for ns, e in self._entries.items() if e.index is not None]
            per = tuple(_stats(ns, index) for ns, index in loaded)
            return IndexStats(
                namespaces=per,
                total_bytes=sum(s.nbytes for s in per),
                budget_bytes=self._settings.memory_budget_bytes,
                loads=self._loads,
                evictions=self._evictions,
                snapshot_loads=self._snapshot_loads,
                snapshots_reconciled=self._reconciled,
                snapshots_rejected=self._rejected,
                snapshots_written=self._written,
                caught_up=self._caught_up,
            )


def _stats(namespace: str, index: NamespaceIndex) -> NamespaceStats:
    return NamespaceStats(
        namespace=namespace,
        kind=index.kind,
        ntotal=index.ntotal,
        nbytes=index.nbytes,
        nlist=index.nlist,
        needs_rebuild=index.needs_rebuild,
    )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _same_vectors(index: NamespaceIndex, rowids: np.ndarray, vecs: np.ndarray) -> bool:
    """Whether the store's embeddings of ``rowids`` are the index's (both normalised)."""
    rowids = np.asarray(rowids, dtype=np.int64)
    vecs = np.asarray(vecs, dtype=np.float32)
    if not len(rowids):
        return True
    if vecs.ndim != 2 or vecs.shape != (len(rowids), index.dim):
        return False
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return bool(np.allclose(index.vectors(rowids), vecs / norms, atol=_ATOL, rtol=0.0))
