"""The store: the source of truth for memories, events, the review queue and idempotency.

:class:`Store` is the protocol the gate depends on; :class:`SQLiteStore` implements it on one
file, ``engine.store.postgres.PostgresStore`` on a PostgreSQL database shared by replicas (the
``postgres`` extra). :func:`open_store` opens either from a path or a ``postgresql://`` DSN.
"""

from engine.store.base import (
    RESOLUTIONS,
    REVIEW_STATUSES,
    ActiveText,
    Embedded,
    Expired,
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
from engine.store.factory import is_dsn, mask_dsn, open_store
from engine.store.sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = [
    "RESOLUTIONS",
    "REVIEW_STATUSES",
    "SCHEMA_VERSION",
    "ActiveText",
    "Embedded",
    "Expired",
    "Resolution",
    "ReviewResolution",
    "ReviewStatus",
    "SQLiteStore",
    "Store",
    "StoreSettings",
    "UndoResult",
    "Write",
    "WriteResult",
    "is_dsn",
    "mask_dsn",
    "new_memory_id",
    "new_review_id",
    "open_store",
]
