"""The vector index: a per-namespace FAISS cache of the store's active embeddings.

Keyed by store rowids; exact (flat inner product) for small namespaces, IVF above
``IndexSettings.exact_max``. ``faiss`` is imported under this package only.
"""

from engine.index.manager import IndexManager, IndexStats, Loader, NamespaceStats
from engine.index.namespace import IndexKind, NamespaceIndex, measure_recall, set_threads
from engine.index.settings import IndexSettings

__all__ = [
    "IndexKind",
    "IndexManager",
    "IndexSettings",
    "IndexStats",
    "Loader",
    "NamespaceIndex",
    "NamespaceStats",
    "measure_recall",
    "set_threads",
]
