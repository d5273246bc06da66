"""The store: the source of truth for memories, events, the review queue and idempotency.

:class:`Store` is the protocol the gate depends on; :class:`SQLiteStore` implements it.
"""

from engine.store.base import (
    RESOLUTIONS,
    REVIEW_STATUSES,
    ActiveText,
    Resolution,
    ReviewResolution,
    ReviewStatus,
    Store,
    StoreSettings,
    UndoResult,
    Write,
    WriteResult,
    new_memory_id,
    new_review_id,
)
from engine.store.sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = [
    "RESOLUTIONS",
    "REVIEW_STATUSES",
    "SCHEMA_VERSION",
    "ActiveText",
    "Resolution",
    "ReviewResolution",
    "ReviewStatus",
    "SQLiteStore",
    "Store",
    "StoreSettings",
    "UndoResult",
    "Write",
    "WriteResult",
    "new_memory_id",
    "new_review_id",
]
