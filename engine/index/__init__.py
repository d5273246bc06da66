"""The vector index: a per-namespace FAISS cache of the store's active embeddings.

Keyed by store rowids; exact (flat inner product) for small namespaces, IVF above
``IndexSettings.exact_max``. Large namespaces are snapshotted to disk (``snapshot``), verified
and reconciled with the store when loaded. ``faiss`` is imported under this package only
(``namespace``).
"""

from engine.index.manager import (
    IndexManager,
    IndexStats,
    Loader,
    NamespaceStats,
    RecoveryReport,
)
from engine.index.namespace import IndexKind, NamespaceIndex, measure_recall, set_threads
from engine.index.settings import IndexSettings
from engine.index.snapshot import SnapshotSource

__all__ = [
    "IndexKind",
    "IndexManager",
    "IndexSettings",
    "IndexStats",
    "Loader",
    "NamespaceIndex",
    "NamespaceStats",
    "RecoveryReport",
    "SnapshotSource",
    "measure_recall",
    "set_threads",
]
