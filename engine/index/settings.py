"""Settings of the vector index. Pure: no faiss import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidInput

__all__ = ["IndexSettings"]


@dataclass(frozen=True)
class IndexSettings:
    """How namespace indexes are built, searched and kept in memory."""

    dim: int = 384
    """Embedding dimension (all-MiniLM-L6-v2: 384)."""
    exact_max: int = 50_000
    """Namespaces with at most this many active vectors get an exact (flat) index; larger ones
    an approximate IVF index, chosen when the namespace is (re)built."""
    nlist: int | Literal["auto"] = "auto"
    """IVF lists. ``auto``: 4 * sqrt(n), at most n / 39 so k-means has enough points per list."""
    nprobe: int = 16
    """IVF lists visited per query (capped at nlist): recall against speed."""
    memory_budget_bytes: int = 2 << 30
    """Estimated bytes all loaded namespace indexes may hold before the least recently used
    ones are evicted (they reload lazily from the store)."""
    threads: int = 1
    """FAISS OpenMP threads (process-wide). 1 by default: the ONNX sessions own the cores."""
    train_points_per_list: int = 256
    """Most training vectors per IVF list; larger namespaces are subsampled for k-means."""
    rebuild_factor: float = 2.0
    """An index that grew past ``rebuild_factor`` x its build size (or an exact index past
    ``exact_max``) reports ``needs_rebuild``."""
    seed: int = 0
    """Seed of the k-means training subsample, so rebuilds are reproducible."""
    snapshot_min_vectors: int = 1_000
    """With a snapshot directory (``IndexManager(snapshot_dir=...)``): namespaces holding at
    least this many vectors are snapshotted after a build, on eviction and on ``close``;
    smaller ones are cheap to rebuild from the store and have their snapshot removed."""
    reconcile_max_fraction: float = 0.5
    """A snapshot whose rowids differ from the store's active set by more than this fraction
    of the namespace is not patched but rebuilt from the store."""

    def __post_init__(self) -> None:
        if not 1 <= self.dim <= 65_536:
            raise InvalidInput(f"dim must be in [1, 65536], got {self.dim}")
        if not 1 <= self.exact_max <= 1 << 40:
            raise InvalidInput(f"exact_max must be in [1, 2**40], got {self.exact_max}")
        if self.nlist != "auto" and (
            isinstance(self.nlist, bool)
            or not isinstance(self.nlist, int)
            or not 1 <= self.nlist <= 1 << 20
        ):
            raise InvalidInput(f"nlist must be 'auto' or in [1, 2**20], got {self.nlist!r}")
        if not 1 <= self.nprobe <= 1 << 20:
            raise InvalidInput(f"nprobe must be in [1, 2**20], got {self.nprobe}")
        if not 0 <= self.memory_budget_bytes <= 1 << 50:
            raise InvalidInput(
                f"memory_budget_bytes must be in [0, 2**50], got {self.memory_budget_bytes}"
            )
        if not 1 <= self.threads <= 1024:
            raise InvalidInput(f"threads must be in [1, 1024], got {self.threads}")
        if not 39 <= self.train_points_per_list <= 100_000:
            raise InvalidInput(
                f"train_points_per_list must be in [39, 100000], got {self.train_points_per_list}"
            )
        if not 1.0 < self.rebuild_factor <= 1000.0:
            raise InvalidInput(f"rebuild_factor must be in (1, 1000], got {self.rebuild_factor}")
        if not 0 <= self.seed < 1 << 32:
            raise InvalidInput(f"seed must be in [0, 2**32), got {self.seed}")
        if not 0 <= self.snapshot_min_vectors <= 1 << 40:
            raise InvalidInput(
                f"snapshot_min_vectors must be in [0, 2**40], got {self.snapshot_min_vectors}"
            )
        if not 0.0 <= self.reconcile_max_fraction <= 1.0:
            raise InvalidInput(
                f"reconcile_max_fraction must be in [0, 1], got {self.reconcile_max_fraction}"
            )

    def lists_for(self, n: int) -> int:
        """IVF lists for a namespace of ``n`` vectors."""
        if self.nlist == "auto":
            return max(1, min(int(4 * n**0.5), n // 39))
        return max(1, min(self.nlist, n))
