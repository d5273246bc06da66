"""Per-namespace indexes, loaded lazily from the store and evicted under a memory budget.

The store is the source of truth; an index is a cache of a namespace's *active* embeddings.
``loader(namespace)`` (``Store.iter_active_embeddings``) rebuilds one on first use. Writes
follow the store: after a commit, ``add`` / ``remove`` the rowids it reports. A namespace that
is not loaded ignores them, since its next load reads the committed store.

Locking: a manager lock guards the table of namespaces, the LRU order and the pin counts;
each namespace has its own lock, held while its index is loaded, searched or changed, so
namespaces never wait on each other. A pinned namespace (one a call is using) is never
evicted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidInput, ModelError
from engine.index.namespace import IndexKind, NamespaceIndex, set_threads
from engine.index.settings import IndexSettings

__all__ = ["IndexManager", "IndexStats", "Loader", "NamespaceStats"]

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


_EMPTY: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.float32), np.empty(0, np.int64))


class _Entry:
    __slots__ = ("accounted", "index", "lock", "pins")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index: NamespaceIndex | None = None
        self.pins = 0
        self.accounted = 0
        """The index's bytes as last counted into the manager's total."""


class IndexManager:
    """All namespace indexes of one engine. Thread-safe."""

    def __init__(self, loader: Loader, settings: IndexSettings = IndexSettings()) -> None:  # noqa: B008
        self._loader = loader
        self._settings = settings
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._total = 0
        self._loads = 0
        self._evictions = 0
        set_threads(settings.threads)

    @property
    def settings(self) -> IndexSettings:
        return self._settings

    # -- pinning and loading ---------------------------------------------------------------

    @contextmanager
    def _use(self, namespace: str, load: bool) -> Iterator[_Entry | None]:
        """Pin the namespace and hold its lock; load its index first when ``load``.

        Yields None when the namespace has no entry and ``load`` is False. ``entry.index`` is
        only ever assigned with both the entry lock and the manager lock held, so ``_shrink``
        and ``stats`` (manager lock only) read it safely.
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
        try:
            with entry.lock:
                if entry.index is None and load:
                    self._install(namespace, entry, self._build(namespace))
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

    def _install(self, namespace: str, entry: _Entry, index: NamespaceIndex | None) -> None:
        """Set a pinned, locked entry's index (None: evict it) and re-apply the budget."""
        with self._lock:
            if index is None and entry.index is not None:
                self._evictions += 1
            entry.index = index
            self._account(entry)
            self._shrink(keep=namespace)

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
                index = self._build(namespace)
                self._install(namespace, entry, index)
                return _stats(namespace, index)
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
