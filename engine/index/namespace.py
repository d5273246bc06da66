"""One namespace's vector index: FAISS inner product on L2-normalised float32 vectors.

Vectors are keyed by the store's int64 ``rowid``. A namespace of at most
``IndexSettings.exact_max`` vectors is searched exactly (``IndexIDMap2(IndexFlatIP)``); a larger
one with an ``IndexIVFFlat`` trained on its own vectors, whose hashtable direct map makes
``remove`` cost O(removed) instead of a scan. The kind is chosen when the index is built;
:attr:`NamespaceIndex.needs_rebuild` says when growth made that choice stale.

``faiss`` is imported in this module only; an instance is not thread-safe (the
``IndexManager`` serialises access per namespace).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import faiss
import numpy as np

from engine.errors import InvalidInput
from engine.index.settings import IndexSettings

__all__ = ["IndexKind", "NamespaceIndex", "measure_recall", "set_threads"]

IndexKind = Literal["exact", "ivf"]

# Per vector, beyond its floats: the int64 id in FAISS, the IDMap2 / direct-map hash entry
# (~48 bytes) and the entry in our Python set of ids (~70 bytes).
_ID_OVERHEAD_BYTES = 128
_MAX_K = 100_000


def set_threads(n: int) -> None:
    """Set FAISS's OpenMP thread count (process-wide)."""
    if not 1 <= n <= 1024:
        raise InvalidInput(f"threads must be in [1, 1024], got {n}")
    faiss.omp_set_num_threads(n)


def _matrix(vecs: np.ndarray, dim: int, what: str) -> np.ndarray:
    """A normalised, C-contiguous float32 copy of ``vecs`` [n, dim]."""
    arr = np.asarray(vecs)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise InvalidInput(f"{what} must have shape [n, {dim}], got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.floating):
        raise InvalidInput(f"{what} must be floating point, got {arr.dtype}")
    x = np.array(arr, dtype=np.float32, order="C", copy=True)
    if not np.isfinite(x).all():
        raise InvalidInput(f"{what} hold NaN or infinity")
    if len(x):
        faiss.normalize_L2(x)
    return x


def _rowids(rowids: Sequence[int] | np.ndarray) -> np.ndarray:
    ids = np.asarray(rowids)
    if ids.ndim != 1:
        raise InvalidInput(f"rowids must be 1-D, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidInput(f"rowids must be integers, got {ids.dtype}")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.size and int(ids.min()) < 0:
        raise InvalidInput("rowids must be >= 0")
    return ids


class NamespaceIndex:
    """The vectors of one namespace, keyed by store rowid. Build with :meth:`build`."""

    def __init__(
        self,
        settings: IndexSettings,
        kind: IndexKind,
        index: Any,
        quantizer: Any = None,
        nlist: int = 0,
        built_n: int = 0,
    ) -> None:
        self._settings = settings
        self._kind: IndexKind = kind
        self._index = index
        # The IVF index points at its quantizer without owning it: keep it alive with the index.
        self._quantizer = quantizer
        self._nlist = nlist
        self._built_n = built_n
        self._ids: set[int] = set()
        self.generation = 0
        """Counts the changes (adds and removes that changed something) since construction."""
        self.saved_generation = -1
        """The generation a snapshot on disk holds (set by the manager); -1: none."""

    @classmethod
    def build(
        cls,
        rowids: Sequence[int] | np.ndarray,
        vecs: np.ndarray,
        settings: IndexSettings,
        kind: IndexKind | None = None,
    ) -> NamespaceIndex:
        """Index ``vecs`` [n, dim] under ``rowids`` [n].

        ``kind`` None picks ``exact`` up to ``settings.exact_max`` vectors and ``ivf`` above;
        ``ivf`` needs at least one vector to train on.
        """
        ids = _rowids(rowids)
        n = len(ids)
        if n == 0:
            vecs = np.empty((0, settings.dim), dtype=np.float32)
        x = _matrix(vecs, settings.dim, "vectors")
        if len(x) != n:
            raise InvalidInput(f"{n} rowids for {len(x)} vectors")
        if kind is None:
            kind = "ivf" if n > settings.exact_max else "exact"
        if kind == "exact":
            out = cls(settings, "exact", faiss.IndexIDMap2(faiss.IndexFlatIP(settings.dim)))
        elif kind == "ivf":
            if n == 0:
                raise InvalidInput("an IVF index needs vectors to train on")
            out = cls._trained_ivf(x, settings)
        else:
            raise InvalidInput(f"kind must be 'exact' or 'ivf', got {kind!r}")
        out._built_n = n
        out._add_normalised(ids, x)
        return out

    @classmethod
    def _trained_ivf(cls, x: np.ndarray, settings: IndexSettings) -> NamespaceIndex:
        n, dim = x.shape
        nlist = settings.lists_for(n)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        # Subsample ourselves (seeded) rather than let k-means do it: reproducible, and no
        # "too many training points" notice on stderr.
        most = nlist * settings.train_points_per_list
        train = x
        if n > most:
            pick = np.random.default_rng(settings.seed).choice(n, size=most, replace=False)
            train = x[np.sort(pick)]
        index.train(train)
        index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
        index.nprobe = min(settings.nprobe, nlist)
        return cls(settings, "ivf", index, quantizer=quantizer, nlist=nlist)

    # -- properties ------------------------------------------------------------------------

    @property
    def kind(self) -> IndexKind:
        return self._kind

    @property
    def dim(self) -> int:
        return self._settings.dim

    @property
    def ntotal(self) -> int:
        return len(self._ids)

    @property
    def nlist(self) -> int:
        """IVF lists; 0 for an exact index."""
        return self._nlist

    @property
    def nbytes(self) -> int:
        """Estimated resident bytes: vectors, ids and their maps, IVF centroids."""
        per_vector = 4 * self.dim + _ID_OVERHEAD_BYTES
        return self.ntotal * per_vector + self._nlist * (4 * self.dim + 64)

    @property
    def needs_rebuild(self) -> bool:
        """True when growth (or shrinkage) made the kind or the IVF training stale."""
        s = self._settings
        if self._kind == "exact":
            return self.ntotal > s.exact_max
        return (
            self.ntotal > s.rebuild_factor * self._built_n
            or self.ntotal * s.rebuild_factor < self._built_n
        )

    def __contains__(self, rowid: object) -> bool:
        return isinstance(rowid, int | np.integer) and int(rowid) in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def built_n(self) -> int:
        """Vectors the index was built (for IVF: trained) with."""
        return self._built_n

    def rowids(self) -> np.ndarray:
        """The rowids held, sorted (int64)."""
        return np.array(sorted(self._ids), dtype=np.int64)

    def vectors(self, rowids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored (normalised) vectors of ``rowids`` [n, dim]; ``InvalidInput`` for a
        rowid that is not held."""
        ids = _rowids(rowids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for i, r in enumerate(ids.tolist()):
            if r not in self._ids:
                raise InvalidInput(f"rowid {r} is not in the index")
            out[i] = self._index.reconstruct(r)
        return out

    # -- serialisation ---------------------------------------------------------------------

    def to_bytes(self) -> np.ndarray:
        """The FAISS index as bytes (``faiss.serialize_index``; uint8 array, no copy to bytes)."""
        return np.asarray(faiss.serialize_index(self._index), dtype=np.uint8)

    @classmethod
    def from_bytes(
        cls,
        payload: bytes | memoryview | np.ndarray,
        settings: IndexSettings,
        kind: IndexKind,
        count: int,
        built_n: int,
    ) -> NamespaceIndex:
        """An index from :meth:`to_bytes` output, checked against what the caller expects.

        Raises ``ValueError`` when the payload does not deserialise or is not an index of
        ``kind`` and ``settings.dim`` (inner product) holding ``count`` distinct rowids.
        Call it on verified bytes only: FAISS trusts the lengths it reads.
        """
        buf = np.frombuffer(payload, dtype=np.uint8)
        try:
            index = faiss.deserialize_index(buf)
        except RuntimeError as exc:
            raise ValueError(f"payload does not deserialise: {str(exc)[:200]}") from None
        dim = settings.dim
        if int(index.d) != dim or int(index.metric_type) != faiss.METRIC_INNER_PRODUCT:
            raise ValueError("payload has another dimension or metric")
        if int(index.ntotal) != count:
            raise ValueError(f"payload holds {index.ntotal} vectors, header says {count}")
        nlist = 0
        if kind == "exact":
            if not isinstance(index, faiss.IndexIDMap2):
                raise ValueError(f"payload is a {type(index).__name__}, not an exact index")
            inner = faiss.downcast_index(index.index)
            if not isinstance(inner, faiss.IndexFlat) or int(inner.ntotal) != count:
                raise ValueError("exact payload does not wrap a flat index")
            ids = faiss.vector_to_array(index.id_map).astype(np.int64, copy=False)
        elif kind == "ivf":
            if not isinstance(index, faiss.IndexIVFFlat) or not index.is_trained:
                raise ValueError(f"payload is a {type(index).__name__}, not a trained IVF index")
            nlist = int(index.nlist)
            if not 1 <= nlist <= max(1, count, built_n) or int(index.quantizer.ntotal) != nlist:
                raise ValueError("IVF payload has an inconsistent number of lists")
            parts = []
            lists = index.invlists
            if lists is None:
                raise ValueError("IVF payload has no inverted lists")
            for li in range(nlist):
                size = int(lists.list_size(li))
                if size:
                    parts.append(faiss.rev_swig_ptr(lists.get_ids(li), size).copy())
            ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
            if index.direct_map.type != faiss.DirectMap.Hashtable:  # type: ignore[attr-defined]
                index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
            index.nprobe = min(settings.nprobe, nlist)
        else:
            raise ValueError(f"kind must be 'exact' or 'ivf', got {kind!r}")
        if len(ids) != count or (count and int(ids.min()) < 0):
            raise ValueError("payload ids do not match its count")
        out = cls(settings, kind, index, nlist=nlist, built_n=built_n)
        out._ids = set(ids.tolist())
        if len(out._ids) != count:
            raise ValueError("payload repeats a rowid")
        return out

    # -- mutation --------------------------------------------------------------------------

    def add(self, rowids: Sequence[int] | np.ndarray, vecs: np.ndarray) -> int:
        """Add vectors under ``rowids``; rowids already present are skipped (a rowid's
        embedding never changes). Returns how many were added."""
        ids = _rowids(rowids)
        x = _matrix(vecs, self.dim, "vectors")
        if len(x) != len(ids):
            raise InvalidInput(f"{len(ids)} rowids for {len(x)} vectors")
        return self._add_normalised(ids, x)

    def _add_normalised(self, ids: np.ndarray, x: np.ndarray) -> int:
        if len(np.unique(ids)) != len(ids):
            raise InvalidInput("rowids repeat within one add")
        fresh = np.fromiter((int(r) not in self._ids for r in ids), dtype=bool, count=len(ids))
        if not fresh.all():
            ids, x = ids[fresh], np.ascontiguousarray(x[fresh])
        if len(ids) == 0:
            return 0
        self._index.add_with_ids(x, ids)
        self._ids.update(ids.tolist())
        self.generation += 1
        return len(ids)

    def remove(self, rowids: Sequence[int] | np.ndarray) -> int:
        """Remove the vectors of ``rowids``; absent ones are ignored. Returns how many went."""
        ids = _rowids(rowids)
        present = np.unique(
            np.fromiter((r for r in ids.tolist() if r in self._ids), dtype=np.int64)
        )
        if len(present) == 0:
            return 0
        if self._kind == "ivf":
            # The hashtable direct map removes only through an IDSelectorArray.
            selector = faiss.IDSelectorArray(len(present), faiss.swig_ptr(present))
            removed = int(self._index.remove_ids(selector))
        else:
            removed = int(self._index.remove_ids(present))
        self._ids.difference_update(present.tolist())
        self.generation += 1
        if removed != len(present):  # pragma: no cover - would mean our id set drifted
            raise RuntimeError(f"faiss removed {removed} of {len(present)} vectors")
        return removed

    # -- search ----------------------------------------------------------------------------

    def search(self, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by cosine similarity for each query of ``vecs`` [m, dim].

        Returns ``(scores float32 [m, k], rowids int64 [m, k])``, best first; missing results
        (fewer than ``k`` vectors) are padded with rowid -1 and score ``-inf``.
        """
        if not 1 <= k <= _MAX_K:
            raise InvalidInput(f"k must be in [1, {_MAX_K}], got {k}")
        q = _matrix(vecs, self.dim, "queries")
        m = len(q)
        if m == 0 or self.ntotal == 0:
            return (
                np.full((m, k), -np.inf, dtype=np.float32),
                np.full((m, k), -1, dtype=np.int64),
            )
        scores, ids = self._index.search(q, k)
        scores = np.asarray(scores, dtype=np.float32)
        ids = np.asarray(ids, dtype=np.int64)
        scores[ids < 0] = -np.inf
        return scores, ids


def measure_recall(vecs: np.ndarray, queries: np.ndarray, k: int, settings: IndexSettings) -> float:
    """Recall@k of the IVF index ``settings`` would build on ``vecs``, against exact search.

    The share of each query's exact top-k that the IVF search also returns, averaged.
    """
    rowids = np.arange(len(vecs), dtype=np.int64)
    exact = NamespaceIndex.build(rowids, vecs, settings, kind="exact")
    approx = NamespaceIndex.build(rowids, vecs, settings, kind="ivf")
    _, truth = exact.search(queries, k)
    _, found = approx.search(queries, k)
    if len(truth) == 0:
        raise InvalidInput("measure_recall needs at least one query")
    hits = 0
    wanted = 0
    for t, f in zip(truth, found, strict=True):
        t = t[t >= 0]
        hits += len(np.intersect1d(t, f[f >= 0]))
        wanted += len(t)
    return hits / wanted if wanted else 1.0
